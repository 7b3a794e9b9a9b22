"""Run CUDA RawKernel sources on the CPU: the same source, compiled by g++ behind a small header.

No development or CI machine has a GPU, yet every RawKernel must be *executed* in the tests. The
shim makes that possible for kernels written in the plain grid-stride style (no ``__syncthreads``,
no shared memory, no warp intrinsics):

* :data:`SHIM_HEADER` defines ``__global__``/``__device__`` away, declares ``threadIdx``,
  ``blockIdx``, ``blockDim`` and ``gridDim`` as thread-local ``dim3``-like globals, and makes
  ``atomicAdd`` a plain read-add-write (the shim runs one thread at a time, so that is exact);
* for every ``extern "C" __global__`` function of the source a host launcher
  ``<name>__shim_launch(ftz, gx, gy, gz, bx, by, bz, <kernel args>)`` is generated: it sets
  ``gridDim``/``blockDim`` and calls the kernel once per (block, thread), blocks and threads in
  increasing x, then y, then z;
* the translation unit is compiled with ``g++ -O2 -shared -fPIC -ffp-contract=off``, cached on
  disk under a hash of everything that goes into it, and loaded with ``ctypes``.

The floating point is the GPU's, as far as a CPU can reproduce it:

* **contraction**: none, on either side. The GPU build gets ``--fmad=false``
  (``nvrtc.KERNEL_OPTIONS``) and g++ ``-ffp-contract=off``, so ``a*b + c`` is two roundings in
  both, as in NumPy;
* **flush to zero**: CuPy compiles every kernel with ``-ftz=true``: float32 operations treat
  subnormal operands as zero and flush subnormal results. The shim's FTZ mode sets the same two
  flags of the SSE unit (MXCSR FTZ and DAZ) around a launch. It is on for float32 kernels (every
  floating-point parameter ``float``), as on the GPU; ``kernel(..., ftz=False)`` runs plain IEEE
  arithmetic. MXCSR would flush doubles too, which a GPU never does, so it is refused for a
  kernel with ``double`` parameters. Float ``atomicAdd`` flushes its operands and its result in
  either mode, as ``atom.global.add.f32`` does; ``minicavs_add_noftz`` (PTX ``add.rn.f32`` on
  the GPU) never flushes. x86-64 only: elsewhere FTZ mode is a :class:`ToolchainError`.

What the shim cannot show — races, the order of atomics, launch limits, asynchronous errors,
stream order and memory-pool reuse — is listed in ``minicavs/cuda/README.md``.

:class:`ShimKernel` is called like ``cupy.RawKernel``: ``kernel(grid, block, args)`` with NumPy
arrays for pointers and Python or NumPy scalars for the rest; argument dtypes are checked against
the kernel's C signature before the call. :func:`elementwise_raw_source` turns an elementwise body
(CuPy ``ElementwiseKernel`` style: names are elements, ``i`` is the index) into such a RawKernel,
so generated fusion kernels run through the same path.
"""

import ctypes
import functools
import platform
import re
from dataclasses import dataclass

import numpy as np

from ..csource import numbered
from ..errors import DTypeError, KernelCompileError, ShapeError, ToolchainError

SHIM_HEADER = r"""// minicavs CPU shim: CUDA kernels compiled for the host (minicavs/cuda/shim.py).
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct minicavs_dim3 { unsigned int x, y, z; };
static thread_local minicavs_dim3 threadIdx, blockIdx, blockDim, gridDim;
static const int warpSize = 32;

#define __global__
#define __device__ static inline
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __ldg(p) (*(p))
// Block-level synchronisation cannot be emulated by running threads one after another.
#define __syncthreads() static_assert(false, "minicavs shim: __syncthreads() is not supported")

// One thread runs at a time, so a plain read-add-write is exact.
template <typename T> static inline T atomicAdd(T* address, T value) {
    T old = *address;
    *address = old + value;
    return old;
}

static inline float minicavs_flush(float x) { return fabsf(x) < FLT_MIN ? copysignf(0.0f, x) : x; }

// atom.global.add.f32 flushes subnormal operands and results to zero, whatever -ftz says.
static inline float atomicAdd(float* address, float value) {
    float old = *address;
    *address = minicavs_flush(minicavs_flush(old) + minicavs_flush(value));
    return old;
}

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define MINICAVS_FTZ_DAZ 0x8040u  // MXCSR: flush results to zero (bit 15), operands (bit 6)

// The launcher's FTZ mode: CuPy's -ftz=true for float32 code.
static inline unsigned int minicavs_fp_mode_enter(int ftz) {
    const unsigned int saved = _mm_getcsr();
    _mm_setcsr(ftz ? (saved | MINICAVS_FTZ_DAZ) : (saved & ~MINICAVS_FTZ_DAZ));
    return saved;
}
static inline void minicavs_fp_mode_leave(unsigned int saved) { _mm_setcsr(saved); }

// PTX add.rn.f32 keeps subnormals under -ftz=true: add with both flags off, in one asm block
// so the compiler cannot move the add across the mode switches.
static inline float minicavs_add_noftz(float a, float b) {
    const unsigned int saved = _mm_getcsr(), plain = saved & ~MINICAVS_FTZ_DAZ;
    __asm__ volatile("ldmxcsr %2\n\taddss %1, %0\n\tldmxcsr %3"
                     : "+x"(a) : "x"(b), "m"(plain), "m"(saved));
    return a;
}
// PTX mul.rn.f32 likewise.
static inline float minicavs_mul_noftz(float a, float b) {
    const unsigned int saved = _mm_getcsr(), plain = saved & ~MINICAVS_FTZ_DAZ;
    __asm__ volatile("ldmxcsr %2\n\tmulss %1, %0\n\tldmxcsr %3"
                     : "+x"(a) : "x"(b), "m"(plain), "m"(saved));
    return a;
}
#else  // the Python side refuses FTZ mode here
static inline unsigned int minicavs_fp_mode_enter(int ftz) { return 0; }
static inline void minicavs_fp_mode_leave(unsigned int saved) {}
static inline float minicavs_add_noftz(float a, float b) { return a + b; }
static inline float minicavs_mul_noftz(float a, float b) { return a * b; }
#endif

// CUDA's reinterpretations of a float's bits.
static inline int __float_as_int(float x) { int i; memcpy(&i, &x, sizeof i); return i; }
static inline float __int_as_float(int i) { float x; memcpy(&x, &i, sizeof x); return x; }

// CUDA's float overloads and helpers that <math.h> spells differently or lacks.
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
template <typename T> static inline T min(T a, T b) { return b < a ? b : a; }
template <typename T> static inline T max(T a, T b) { return a < b ? b : a; }
"""

# -ffp-contract=off: no FMA, as --fmad=false on the GPU side; -frounding-math: the launcher
# switches the FP mode (FTZ), so g++ must neither fold FP work at compile time nor move it across.
CXX_FLAGS = ("-O2", "-shared", "-fPIC", "-std=c++17", "-ffp-contract=off", "-fno-fast-math",
             "-frounding-math", "-w")
INSTALL_HINT = "install a C++ compiler: apt-get install g++   (or set CXX to one)"

# C scalar type (after dropping const/volatile/__restrict__) -> (ctypes type, NumPy dtype).
_C_TYPES = {
    "float": (ctypes.c_float, np.float32),
    "double": (ctypes.c_double, np.float64),
    "bool": (ctypes.c_bool, np.bool_),
    "char": (ctypes.c_char, np.int8),
    "signed char": (ctypes.c_byte, np.int8),
    "unsigned char": (ctypes.c_ubyte, np.uint8),
    "short": (ctypes.c_short, np.int16),
    "unsigned short": (ctypes.c_ushort, np.uint16),
    "int": (ctypes.c_int, np.int32),
    "unsigned int": (ctypes.c_uint, np.uint32),
    "unsigned": (ctypes.c_uint, np.uint32),
    "long long": (ctypes.c_longlong, np.int64),
    "unsigned long long": (ctypes.c_ulonglong, np.uint64),
    "size_t": (ctypes.c_size_t, np.uint64),
    "ptrdiff_t": (ctypes.c_ssize_t, np.int64),
}
for _t in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"):
    _C_TYPES[f"{_t}_t"] = (getattr(ctypes, f"c_{_t}"), getattr(np, _t))  # <stdint.h>'s types
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict"}
_SIGNATURE = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)', re.S)


@dataclass(frozen=True)
class KernelParam:
    """One parameter of a kernel: its C declaration split into the parts the launcher needs."""

    decl: str  # as written, e.g. "const float* __restrict__ src"
    name: str
    base: str  # scalar type without qualifiers or '*', e.g. "float"
    pointer: bool
    const: bool

    @property
    def ctype(self):
        return ctypes.c_void_p if self.pointer else _C_TYPES[self.base][0]

    @property
    def dtype(self):
        return np.dtype(_C_TYPES[self.base][1])


def _parse_param(kernel, decl):
    decl = " ".join(decl.split())
    match = re.fullmatch(r"(.*?)\s*\b(\w+)", decl)
    if not match or not match.group(1):
        raise KernelCompileError(f"shim: cannot read parameter {decl!r} of kernel '{kernel}'")
    type_part, name = match.groups()
    pointer = type_part.count("*")
    words = type_part.replace("*", " ").split()
    base = " ".join(w for w in words if w not in _QUALIFIERS)
    if pointer > 1 or base not in _C_TYPES:
        raise KernelCompileError(
            f"shim: parameter '{decl}' of kernel '{kernel}' has a type the shim cannot pass "
            f"(supported: a pointer to, or a value of, one of {sorted(_C_TYPES)})")
    const = "const" in type_part.split("*")[0].split()
    return KernelParam(decl, name, base, bool(pointer), const)


def parse_kernels(source):
    """``{name: (KernelParam, ...)}`` for every ``extern "C" __global__ void`` in ``source``."""
    kernels = {}
    for match in _SIGNATURE.finditer(source):
        name, params = match.group(1), match.group(2).strip()
        decls = [p for p in params.split(",")] if params and params != "void" else []
        kernels[name] = tuple(_parse_param(name, d) for d in decls)
    return kernels


def launcher_source(name, params):
    """C++ of the exported host launcher that runs kernel ``name`` over a grid of blocks."""
    decls = "".join(f", {p.decl}" for p in params)
    call = ", ".join(p.name for p in params)
    # Every local name has a prefix no kernel parameter uses.
    return f"""
extern "C" void {name}__shim_launch(int mc_ftz, unsigned int mc_gx, unsigned int mc_gy,
                                    unsigned int mc_gz, unsigned int mc_bx, unsigned int mc_by,
                                    unsigned int mc_bz{decls}) {{
    const unsigned int mc_saved_mode = minicavs_fp_mode_enter(mc_ftz);
    gridDim = minicavs_dim3{{mc_gx, mc_gy, mc_gz}};
    blockDim = minicavs_dim3{{mc_bx, mc_by, mc_bz}};
    for (unsigned int mc_z = 0; mc_z < mc_gz; ++mc_z)
    for (unsigned int mc_y = 0; mc_y < mc_gy; ++mc_y)
    for (unsigned int mc_x = 0; mc_x < mc_gx; ++mc_x) {{
        blockIdx = minicavs_dim3{{mc_x, mc_y, mc_z}};
        for (unsigned int mc_tz = 0; mc_tz < mc_bz; ++mc_tz)
        for (unsigned int mc_ty = 0; mc_ty < mc_by; ++mc_ty)
        for (unsigned int mc_tx = 0; mc_tx < mc_bx; ++mc_tx) {{
            threadIdx = minicavs_dim3{{mc_tx, mc_ty, mc_tz}};
            {name}({call});
        }}
    }}
    minicavs_fp_mode_leave(mc_saved_mode);
}}
"""


def translation_unit(source, kernels, filename="kernel.cu"):
    """Header + the kernel source (with its own line numbers) + one launcher per kernel."""
    launchers = "".join(launcher_source(n, p) for n, p in kernels.items())
    return (f'{SHIM_HEADER}\n#line 1 "{filename}"\n{source}\n'
            f'#line 1 "minicavs_shim_launchers.cpp"\n{launchers}')


def compiler():
    """``(path, version line)`` of the C++ compiler (``$CXX``, else g++); raises if missing."""
    from ..cpu.build import find_compiler

    return find_compiler("the CPU shim", INSTALL_HINT)


def cache_dir():
    """Where compiled shim libraries are kept: ``$MINICAVS_CACHE_DIR/shim``, else
    ``~/.cache/minicavs/shim``, else a per-user folder in the temp dir."""
    from ..cpu.build import cache_dir as compiled_code_dir

    return compiled_code_dir("shim")


def _build(unit, tag):
    """Compile ``unit`` to a shared library in the cache (reused when its entry is sound: the
    checks and atomic writes of :func:`minicavs.cpu.build.compile_library`); return its path."""
    from ..cpu.build import cache_key, compile_library

    cxx, version = compiler()

    def commands(cpps, objs, out):  # noqa: ARG001 (one unit, one step: no object file)
        return ([[cxx, *CXX_FLAGS, "-x", "c++", "-o", out, *cpps]],)

    def failure(log):
        return KernelCompileError(
            f"the CPU shim ({version}) could not compile kernel source '{tag}'.\n"
            f"--- compiler log ---\n{log}\n--- translation unit ---\n{numbered(unit)}",
            log=log, source=unit)

    path, _ = compile_library(unit, tag, kind="shim", key=cache_key(unit, version, *CXX_FLAGS),
                              commands=commands, failure=failure)
    return path


class ShimModule:
    """All kernels of one CUDA source, compiled for the CPU (the shim's ``cupy.RawModule``)."""

    def __init__(self, source, tag=None):
        self.source = source
        self.params = parse_kernels(source)
        if not self.params:
            raise KernelCompileError('shim: the source defines no extern "C" __global__ kernel:\n'
                                     + numbered(source))
        tag = tag or next(iter(self.params))
        self.path = _build(translation_unit(source, self.params, f"{tag}.cu"), tag)
        self._lib = ctypes.CDLL(self.path)

    def get_function(self, name):
        if name not in self.params:
            raise KernelCompileError(f"shim: kernel '{name}' is not in this source "
                                     f"(it defines {sorted(self.params)})")
        launch = getattr(self._lib, f"{name}__shim_launch")
        launch.argtypes = [ctypes.c_int] + [ctypes.c_uint] * 6 + [p.ctype
                                                                   for p in self.params[name]]
        launch.restype = None
        return ShimKernel(name, self.params[name], launch)


def ftz_supported():
    """Whether the shim can run in FTZ mode here (the MXCSR flags of x86-64)."""
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


class ShimKernel:
    """One kernel on the CPU, called like ``cupy.RawKernel``: ``kernel(grid, block, args)``,
    plus ``ftz``: None (the default) runs it as CuPy would, in FTZ mode when it is a float32
    kernel; True or False chooses (see the module docstring)."""

    def __init__(self, name, params, launch):
        self.name, self.params, self._launch = name, params, launch
        floats = {p.base for p in params if p.base in ("float", "double")}
        self.float32_only = floats == {"float"}
        self.has_double = "double" in floats

    def __call__(self, grid, block, args, *, ftz=None):
        grid, block = _dim3(grid, "grid"), _dim3(block, "block")
        if len(args) != len(self.params):
            raise ShapeError(f"kernel '{self.name}' takes {len(self.params)} arguments "
                             f"({', '.join(p.name for p in self.params)}), got {len(args)}")
        ftz = self.float32_only if ftz is None else bool(ftz)
        if ftz and self.has_double:
            raise DTypeError(f"kernel '{self.name}': FTZ mode models float32 code, and this "
                             "kernel has double parameters (the CPU flag would flush doubles, "
                             "which a GPU never does); call it with ftz=False")
        if ftz and not ftz_supported():
            raise ToolchainError(f"kernel '{self.name}': the shim's FTZ mode needs an x86-64 "
                                 f"CPU (this is {platform.machine()}); call it with ftz=False")
        converted = [self._convert(p, a) for p, a in zip(self.params, args)]
        self._launch(int(ftz), *grid, *block, *converted)

    def _convert(self, param, value):
        where = f"kernel '{self.name}', argument '{param.name}'"
        if not param.pointer:
            if isinstance(value, np.ndarray):
                raise DTypeError(f"{where}: expected a {param.base} scalar, got an array")
            return param.ctype(value)
        if not isinstance(value, np.ndarray):
            raise DTypeError(f"{where}: expected a NumPy array ({param.decl}), "
                             f"got {type(value).__name__}")
        if value.dtype != param.dtype:
            raise DTypeError(f"{where}: expected dtype {param.dtype} ({param.decl}), "
                             f"got {value.dtype}")
        if not value.flags.c_contiguous:
            raise ShapeError(f"{where}: the array must be C-contiguous")
        if not param.const and not value.flags.writeable:
            raise ShapeError(f"{where}: the kernel writes this array, but it is read-only")
        return value.ctypes.data


def _dim3(dims, what):
    dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
    if not 1 <= len(dims) <= 3 or any(int(d) < 1 for d in dims):
        raise ShapeError(f"shim launch: {what} must be 1 to 3 positive sizes, got {dims}")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


@functools.lru_cache(maxsize=None)
def shim_module(source, tag=None):
    """The compiled :class:`ShimModule` of ``source`` (memoised per process, on disk across)."""
    return ShimModule(source, tag)


def shim_kernel(source, name):
    """The CPU twin of ``cupy.RawKernel(source, name)``."""
    return shim_module(source, name).get_function(name)


def elementwise_raw_source(name, in_params, out_params, operation, preamble=""):
    """A grid-stride RawKernel that runs an elementwise ``operation`` for every index ``i``.

    ``in_params``/``out_params`` are ``(c_type, name)`` pairs; inside ``operation`` each name is
    the element at ``i`` (inputs by value, outputs by reference), as in CuPy's ElementwiseKernel,
    and ``i`` is the element index. The kernel takes the arrays in order, then ``long long n``.
    The result compiles with NVRTC and runs through the shim, so fused bodies are checked on CPU.
    """
    args = [f"const {t}* __restrict__ {n}__raw" for t, n in in_params]
    args += [f"{t}* __restrict__ {n}__raw" for t, n in out_params]
    loads = "".join(f"        const {t} {n} = {n}__raw[i];\n" for t, n in in_params)
    refs = "".join(f"        {t}& {n} = {n}__raw[i];\n" for t, n in out_params)
    body = "\n".join("        " + line for line in operation.strip().splitlines())
    return f"""{preamble}
extern "C" __global__ void {name}({', '.join(args + ['const long long n'])})
{{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {{
{loads}{refs}{body}
    }}
}}
"""
