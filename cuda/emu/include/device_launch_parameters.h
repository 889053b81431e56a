// Emulated build: everything lives in the force-included emu.h.
#pragma once
