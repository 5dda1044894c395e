"""Run the benchmarks and print their figures.

By default the simulator's speed (bench.sim_speed). ``--scaling`` adds the
cost per call by run length and deployment size (bench.sim_scaling, a few
minutes); ``--gateway-latency`` adds bench.gateway_latency (several minutes
and extra servers).
"""

import sys

from bench import sim_speed

if __name__ == "__main__":
    flags = {"--scaling", "--gateway-latency"}
    chosen = flags & set(sys.argv[1:])
    sim_speed.main([a for a in sys.argv[1:] if a not in flags])
    if "--scaling" in chosen:
        from bench import sim_scaling

        sim_scaling.main([])
    if "--gateway-latency" in chosen:
        from bench import gateway_latency

        gateway_latency.main([])
