// emu_api.h: the C interface of a host build of the kernels, for the
// emulated device of internal/backend/cuda/emu. The translation unit that
// includes it includes every .cu file first and then defines the kernel
// table with TITAN_EMU_KERNELS (generated from the sources).
#ifndef TITAN_EMU_API_H
#define TITAN_EMU_API_H

#include <cstring>
#include <exception>

#define TITAN_EMU_KERNELS(...)                                                                             \
	static const cuda_emu::Kernel titan_emu_kernels[] = {__VA_ARGS__};                                 \
	extern "C" int emu_kernel_count() { return int(sizeof titan_emu_kernels / sizeof titan_emu_kernels[0]); } \
	extern "C" const char *emu_kernel_name(int i) { return titan_emu_kernels[i].name; }                 \
	extern "C" void emu_set_order(int o) { cuda_emu::set_order(o); }                                   \
	extern "C" int emu_launch(const char *name, unsigned gx, unsigned gy, unsigned gz, unsigned bx,     \
				  unsigned by, unsigned bz, void **params, char *err, int errlen) {                 \
		for (const auto &k : titan_emu_kernels) {                                                  \
			if (std::strcmp(k.name, name) == 0) {                                              \
				try {                                                                      \
					cuda_emu::launch(dim3(gx, gy, gz), dim3(bx, by, bz),               \
							 [&] { k.call(params); });                        \
				} catch (const std::exception &e) {                                        \
					std::snprintf(err, size_t(errlen), "%s", e.what());                \
					return 2;                                                          \
				}                                                                          \
				return 0;                                                                  \
			}                                                                                  \
		}                                                                                          \
		std::snprintf(err, size_t(errlen), "no kernel named %s", name);                            \
		return 1;                                                                                  \
	}

#endif
