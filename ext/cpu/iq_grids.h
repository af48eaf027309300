/* The codebooks of the IQ1/IQ2/IQ3 weight types (iq_grids.c), read by iq_lanes.h. */
#ifndef INFERD_IQ_GRIDS_H
#define INFERD_IQ_GRIDS_H

#include <stdint.h>

extern const uint64_t IQ2XXS_GRID[256], IQ2XS_GRID[512], IQ2S_GRID[1024], IQ1S_GRID[2048];
extern const uint32_t IQ3XXS_GRID[256], IQ3S_GRID[512];

#endif
