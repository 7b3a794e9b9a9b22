"""Chapter 3: the checker hides an op (x cubed) whose VJP is wrong for some inputs, and runs
gradcheck on arrays your strategy draws. Write a hypothesis strategy that finds the bug.
Check: python -m minicavs.exercises check gradcheck"""
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp


def inputs():
    return hnp.arrays(np.float64, (3,), elements=st.floats(0, 1))
