// The emulated build's assert: a failed assert in a kernel stops its block with
// an error naming the kernel (through the runtime), as a device-side assert does.
#include_next <assert.h>
#ifndef NDEBUG
#undef assert
#define assert(e) ((e) ? (void)0 : ::asrforge_emu::trap("assert(" #e ")", __FILE__, __LINE__))
#endif
