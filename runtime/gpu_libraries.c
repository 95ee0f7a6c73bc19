/* gpu_libraries.c: cuBLAS, cuBLASLt and NCCL loaded at their first use (gpu_libraries.h). */
#include "gpu_libraries.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "world.h"

/* One library: its soname (the major version this build was compiled for),
 * the handle, the file it came from. */
typedef struct {
    const char *name;
    char soname[32];
    void *handle;
    char file[512];
    pthread_once_t once;
} Library;

static Library cublas_library = { .name = "cuBLAS", .once = PTHREAD_ONCE_INIT };
static Library cublaslt_library = { .name = "cuBLASLt", .once = PTHREAD_ONCE_INIT };
static Library nccl_library = { .name = "NCCL", .once = PTHREAD_ONCE_INIT };
static Cublas cublas;
static Cublaslt cublaslt;
static Nccl nccl;

static void fail(const Library *lib, const char *why) {
    fprintf(stderr, "error: %s (%s) cannot be loaded: %s\n", lib->name, lib->soname, why);
    world_abort(1);
}

static void open_library(Library *lib) {
    lib->handle = dlopen(lib->soname, RTLD_NOW | RTLD_LOCAL);
    if (!lib->handle) fail(lib, dlerror());
    struct link_map *map = NULL;
    if (dlinfo(lib->handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name)
        snprintf(lib->file, sizeof lib->file, "%s", map->l_name);
}

/* The address of `symbol` in lib, which must have it. */
static void *function_of(const Library *lib, const char *symbol) {
    dlerror();
    void *f = dlsym(lib->handle, symbol);
    if (!f) {
        char why[1024];
        const char *err = dlerror();
        snprintf(why, sizeof why, "no %s in %s (%s)", symbol, lib->file, err ? err : "a null symbol");
        fail(lib, why);
    }
    return f;
}

static void load_cublas(void) {
    Library *lib = &cublas_library;
    snprintf(lib->soname, sizeof lib->soname, "libcublas.so.%d", CUBLAS_VER_MAJOR);
    open_library(lib);
    cublas.create = (__typeof__(cublas.create))function_of(lib, "cublasCreate_v2");
    cublas.destroy = (__typeof__(cublas.destroy))function_of(lib, "cublasDestroy_v2");
    cublas.set_stream = (__typeof__(cublas.set_stream))function_of(lib, "cublasSetStream_v2");
    cublas.set_math_mode = (__typeof__(cublas.set_math_mode))function_of(lib, "cublasSetMathMode");
    cublas.sgemm = (__typeof__(cublas.sgemm))function_of(lib, "cublasSgemm_v2");
    cublas.sgemm_strided_batched =
        (__typeof__(cublas.sgemm_strided_batched))function_of(lib, "cublasSgemmStridedBatched");
}

static void load_cublaslt(void) {
    Library *lib = &cublaslt_library;
    snprintf(lib->soname, sizeof lib->soname, "libcublasLt.so.%d", CUBLAS_VER_MAJOR);
    open_library(lib);
    cublaslt.create = (__typeof__(cublaslt.create))function_of(lib, "cublasLtCreate");
    cublaslt.destroy = (__typeof__(cublaslt.destroy))function_of(lib, "cublasLtDestroy");
    cublaslt.desc_create = (__typeof__(cublaslt.desc_create))function_of(lib, "cublasLtMatmulDescCreate");
    cublaslt.desc_destroy = (__typeof__(cublaslt.desc_destroy))function_of(lib, "cublasLtMatmulDescDestroy");
    cublaslt.desc_set = (__typeof__(cublaslt.desc_set))function_of(lib, "cublasLtMatmulDescSetAttribute");
    cublaslt.layout_create = (__typeof__(cublaslt.layout_create))function_of(lib, "cublasLtMatrixLayoutCreate");
    cublaslt.layout_destroy = (__typeof__(cublaslt.layout_destroy))function_of(lib, "cublasLtMatrixLayoutDestroy");
    cublaslt.preference_create =
        (__typeof__(cublaslt.preference_create))function_of(lib, "cublasLtMatmulPreferenceCreate");
    cublaslt.preference_destroy =
        (__typeof__(cublaslt.preference_destroy))function_of(lib, "cublasLtMatmulPreferenceDestroy");
    cublaslt.preference_set =
        (__typeof__(cublaslt.preference_set))function_of(lib, "cublasLtMatmulPreferenceSetAttribute");
    cublaslt.heuristic = (__typeof__(cublaslt.heuristic))function_of(lib, "cublasLtMatmulAlgoGetHeuristic");
    cublaslt.matmul = (__typeof__(cublaslt.matmul))function_of(lib, "cublasLtMatmul");
}

static void load_nccl(void) {
    Library *lib = &nccl_library;
    snprintf(lib->soname, sizeof lib->soname, "libnccl.so.%d", NCCL_MAJOR);
    open_library(lib);
    nccl.get_version = (__typeof__(nccl.get_version))function_of(lib, "ncclGetVersion");
    nccl.get_unique_id = (__typeof__(nccl.get_unique_id))function_of(lib, "ncclGetUniqueId");
    nccl.comm_init_rank = (__typeof__(nccl.comm_init_rank))function_of(lib, "ncclCommInitRank");
    nccl.comm_destroy = (__typeof__(nccl.comm_destroy))function_of(lib, "ncclCommDestroy");
    nccl.comm_abort = (__typeof__(nccl.comm_abort))function_of(lib, "ncclCommAbort");
    nccl.comm_get_async_error = (__typeof__(nccl.comm_get_async_error))function_of(lib, "ncclCommGetAsyncError");
    nccl.get_error_string = (__typeof__(nccl.get_error_string))function_of(lib, "ncclGetErrorString");
    nccl.get_last_error = (__typeof__(nccl.get_last_error))function_of(lib, "ncclGetLastError");
    nccl.group_start = (__typeof__(nccl.group_start))function_of(lib, "ncclGroupStart");
    nccl.group_end = (__typeof__(nccl.group_end))function_of(lib, "ncclGroupEnd");
    nccl.send = (__typeof__(nccl.send))function_of(lib, "ncclSend");
    nccl.recv = (__typeof__(nccl.recv))function_of(lib, "ncclRecv");
    nccl.reduce_scatter = (__typeof__(nccl.reduce_scatter))function_of(lib, "ncclReduceScatter");
    nccl.all_gather = (__typeof__(nccl.all_gather))function_of(lib, "ncclAllGather");
}

static void once(Library *lib, void (*load)(void)) {
    int rc = pthread_once(&lib->once, load);
    if (rc) {
        fprintf(stderr, "fatal: pthread_once failed (%d) loading %s\n", rc, lib->name);
        abort();
    }
}

const Cublas *gpu_cublas(void) {
    once(&cublas_library, load_cublas);
    return &cublas;
}

const Cublaslt *gpu_cublaslt(void) {
    once(&cublaslt_library, load_cublaslt);
    return &cublaslt;
}

const Nccl *gpu_nccl(void) {
    once(&nccl_library, load_nccl);
    return &nccl;
}

void gpu_library_files(char *buf, size_t len) {
    const Library *libs[3] = { &cublas_library, &cublaslt_library, &nccl_library };
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < 3 && used < len; i++)
        if (libs[i]->handle)
            used += (size_t)snprintf(buf + used, len - used, "%s%s from %s", used ? ", " : "", libs[i]->name,
                                     libs[i]->file);
    if (!buf[0]) snprintf(buf, len, "cuBLAS, cuBLASLt and NCCL not loaded");
}
