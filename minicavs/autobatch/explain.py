"""``AutoBatch.explain()``: what was recorded, the batches formed, what was copied, the time.

The picture lists the batches of a segment in execution order, one line each: the signature
(op and per-node operand shapes, ``W`` for a shared parameter), one ``#`` per node, and how its
operands were read (``=`` a view of contiguous rows, ``g`` a gather).
"""

from ..runtime import backends


def explain(scope, picture=True, max_batches=40):
    lines = [f"autobatch strategy={scope.strategy!r}: {len(scope.segments)} segment(s)"]
    for i, seg in enumerate(scope.segments):
        st = seg.stats
        batches = max(st.get("batches", 0), 1)
        lines.append(
            f"segment {i}: {st['nodes']} nodes -> {st.get('batches', 0)} batches "
            f"(average {st['nodes'] / batches:.1f} nodes per batch)")
        kernels = {id(b.sig.forward): b.sig.forward for b in seg.plan}.values()
        fused = sum(bool(k.exe.program.groups) for k in kernels)
        lines.append(
            f"  run by the runtime's driver: {backends.static_backend(seg.xp)}; {len(kernels)} "
            f"batched kernels (Programs), {fused} with fused groups")
        if "batches_from_c" in st or "why_not_from_c" in st:
            lines.append(f"  batches issued from C: forward {st.get('batches_from_c', 0)} of "
                         f"{st.get('batches', 0)}, backward "
                         f"{st.get('backward_batches_from_c', '-')}, shared operands' "
                         f"gradients {st.get('shared_gradients_from_c', '-')} "
                         f"(autobatch/launches.py); on the interpreter:")
            for label, why in sorted(st["why_not_from_c"].items()):
                lines.append(f"    {label}: {why}")
        lines.append(
            f"  forward gathers: {st['copies_made']} copied, {st['copies_avoided']} avoided "
            f"(operand rows already contiguous)")
        if st.get("views"):
            lines.append(f"  views: {st['views']} slices or reshapes of pending values read in "
                         f"place (no node, no batch, no copy)")
        if st["backward_s"]:
            lines.append(
                f"  backward scatters: {st['scatter_made']} indexed, {st['scatter_avoided']} "
                f"into contiguous rows")
            if seg.plus:
                lines.append(
                    f"  parameter gradients ('+'): {st['plus_products']} products instead of "
                    f"{st['plus_products'] + st['plus_products_saved']}, "
                    f"{st['plus_copies']} contiguous copies made for them, "
                    f"{st['plus_copies_avoided']} avoided (rows already one run)")
        if "forward_launches" in st:
            lines.append(
                f"  launches (emulated device): forward {st['forward_launches']} "
                f"({st['forward_launches'] / batches:.1f} per batch), backward "
                f"{st.get('backward_launches', '-')}")
        lines.append(
            f"  time: recording {_ms(st.get('record_s'))}, scheduling {_ms(st.get('schedule_s'))}"
            f", forward {_ms(st.get('forward_s'))}, backward {_ms(st['backward_s'])}")
        if "host_us_per_node" in st:
            lines.append(
                f"  host time per node: {st['host_us_per_node']:.2f} µs (recording, scheduling, "
                f"launch preparation; the device's own {_ms(st['kernel_s'])} left out)" +
                (f"; host->device copies: {st['uploads']}" if "uploads" in st else ""))
        launches = st.get("forward_launches_by_signature")
        lines.append("  batches per signature (batches, nodes" +
                     (", forward launches per batch):" if launches else "):"))
        for label, (count, nodes) in sorted(st["by_signature"].items(),
                                            key=lambda kv: -kv[1][1]):
            lines.append(f"    {label:<46} {count:>5} {nodes:>7}   avg {nodes / count:.1f}" +
                         (f"   {launches.get(label, 0) / count:.1f}" if launches else ""))
        if picture:
            lines.append("  batches in execution order (# = one node; operands: = view, g gather):")
            for j, b in enumerate(seg.plan[:max_batches]):
                reads = "".join("=" if entry[3] is None else "g" for entry in b.inputs)
                lines.append(f"    {j:>3} {b.sig.label:<40} {reads:<3} {'#' * min(b.n, 60)}"
                             f"{'+' if b.n > 60 else ''} {b.n}")
            if len(seg.plan) > max_batches:
                lines.append(f"    ... {len(seg.plan) - max_batches} more")
    return "\n".join(lines)


def _ms(seconds):
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"
