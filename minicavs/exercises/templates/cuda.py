"""Chapter 13: a CUDA kernel ``axpy`` computing y[i] = a * x[i] + y[i] for i < n, in the
grid-stride style (the grid may have fewer threads than n). The checker runs it on the CPU
through minicavs' g++ shim with 4 blocks of 64 threads, and compiles it with NVRTC if present.
Check: python -m minicavs.exercises check cuda"""

SOURCE = r"""
extern "C" __global__ void axpy(const float a, const float* x, float* y, const long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    // your code here
}
"""
