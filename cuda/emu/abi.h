// The C ABI every emulated module (lib<stem>.so) exports; the contract with
// src/backend/cuda's emulated driver (see cuda/README.md, "The emulator").
#pragma once
#include <stddef.h>

#define ASRFORGE_EMU_ABI 1

#ifdef __cplusplus
extern "C" {
#endif

// Returns ASRFORGE_EMU_ABI.
int asrforge_emu_abi(void);
// The number of `extern "C" __global__` kernels of this module.
size_t asrforge_emu_kernel_count(void);
// The name of kernel i (NULL when i is out of range).
const char* asrforge_emu_kernel_name(size_t i);
// Runs kernel i over the whole grid; returns when every block has finished.
// args[p] points at parameter p's value (cuLaunchKernel's kernelParams).
// Returns 0, or non-zero after writing a NUL-terminated message naming the
// kernel (and block/thread where known) into err[0..err_len).
int asrforge_emu_launch(size_t i, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned dyn_shared_bytes, void** args, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
