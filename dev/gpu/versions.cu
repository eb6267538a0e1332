// dev/gpu/versions.cu: the versions of what the GPU binaries run with, for dev/gpu_check.sh's "versions" stage
// (make gpu_binaries builds it as build/gpu/versions). The CUDA runtime is linked statically, as in every
// binary of this repository, so its version is theirs; cuBLASLt and NCCL are opened with dlopen under the
// names the binaries link (libcublasLt.so.13, libnccl.so.2), so the same LD_LIBRARY_PATH finds the same files,
// and the program runs (and says so) where one of them is missing. The last line sums it up.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <link.h>
#include <cstdio>
#include <cstring>
#include <string>

static std::string dotted(int v, int major_div, int minor_div, int minor_mod) {  // 13000 -> "13.0", ...
    char buf[32];
    snprintf(buf, sizeof buf, "%d.%d", v / major_div, (v / minor_div) % minor_mod);
    return buf;
}

static std::string path_of(void* handle) {
    struct link_map* map = nullptr;
    if (handle && dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name) return map->l_name;
    return "?";
}

int main() {
    int runtime = 0, driver = 0;
    cudaError_t e = cudaRuntimeGetVersion(&runtime);
    printf("CUDA runtime (cudart, static in every binary): %d = %s%s\n", runtime, dotted(runtime, 1000, 10, 100).c_str(),
           e == cudaSuccess ? "" : " (error)");
    e = cudaDriverGetVersion(&driver);
    std::string driver_s = driver ? dotted(driver, 1000, 10, 100) : std::string("none");
    printf("CUDA driver API: %d = %s%s%s%s\n", driver, driver_s.c_str(), e == cudaSuccess ? "" : " (", e == cudaSuccess ? "" : cudaGetErrorString(e),
           e == cudaSuccess ? "" : ")");
    std::string device = "no device";
    int count = 0;
    if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) {
        cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, 0) == cudaSuccess) {
            char buf[320];
            snprintf(buf, sizeof buf, "%s, sm_%d%d, %d SMs, %.1f GiB, %d devices", p.name, p.major, p.minor, p.multiProcessorCount,
                     p.totalGlobalMem / 1073741824.0, count);
            device = buf;
        }
    } else {
        (void)cudaGetLastError();
    }
    printf("device: %s\n", device.c_str());

    std::string lt_s = "not found";
    void* lt = dlopen("libcublasLt.so.13", RTLD_NOW | RTLD_LOCAL);
    if (lt) {
        auto version = reinterpret_cast<size_t (*)()>(dlsym(lt, "cublasLtGetVersion"));
        auto cudart = reinterpret_cast<size_t (*)()>(dlsym(lt, "cublasLtGetCudartVersion"));
        int v = version ? (int)version() : 0, c = cudart ? (int)cudart() : 0;
        lt_s = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
        printf("cuBLASLt: %d = %s, built for cudart %d, from %s\n", v, lt_s.c_str(), c, path_of(lt).c_str());
    } else {
        printf("cuBLASLt: libcublasLt.so.13 not found (%s)\n", dlerror());
    }
    std::string nccl_s = "not found";
    void* nccl = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (nccl) {
        auto version = reinterpret_cast<int (*)(int*)>(dlsym(nccl, "ncclGetVersion"));
        int v = 0;
        if (version) version(&v);
        // NCCL >= 2.9: major * 10000 + minor * 100 + patch
        nccl_s = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
        printf("NCCL: %d = %s, from %s\n", v, nccl_s.c_str(), path_of(nccl).c_str());
    } else {
        printf("NCCL: libnccl.so.2 not found (%s)\n", dlerror());
    }
    printf("runtime %s, driver API %s, cuBLASLt %s, NCCL %s; %s\n", dotted(runtime, 1000, 10, 100).c_str(), driver_s.c_str(),
           lt_s.c_str(), nccl_s.c_str(), device.c_str());
    return 0;
}
