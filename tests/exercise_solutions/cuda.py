SOURCE = r"""
extern "C" __global__ void axpy(const float a, const float* x, float* y, const long long n)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x)
        y[i] = a * x[i] + y[i];
}
"""
