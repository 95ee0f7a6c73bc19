/* stream_stress.h: streams and events driven from several host threads at once.
 *
 * Shared by the Criterion suite and the ThreadSanitizer driver (Criterion itself
 * cannot start under ThreadSanitizer: Snaipe/Criterion#274).
 */
#ifndef ZF_STREAM_STRESS_H
#define ZF_STREAM_STRESS_H

#include "../runtime/device_cpu.h"

/* Each of `threads` host threads drives its own two streams for `rounds` rounds:
 * a slow write on one, a read on the other behind an event, and the next write
 * behind the read's event. Returns how many reads saw the wrong value (0). */
int stream_stress(Device *dev, int threads, int rounds);

#endif
