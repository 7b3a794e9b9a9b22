import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp


def inputs():
    return hnp.arrays(np.float64, (3,), elements=st.floats(-5, 5))
