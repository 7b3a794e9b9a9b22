"""Chapter 2: the VJP of softsign(x) = x / (1 + |x|). ``g`` is the gradient flowing into the
output ``out``; return a tuple with the gradient of ``x``, written with ops (mc.abs, mc.sign, ...).
Check: python -m minicavs.exercises check autodiff"""
import minicavs as mc


def vjp(g, out, x):
    return (g,)          # wrong: this is the VJP of the identity
