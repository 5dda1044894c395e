"""Run every benchmark and print its figures.

``--gateway-latency`` also runs bench.gateway_latency (several minutes and
extra servers, so it is not part of the default run).
"""

import sys

from bench import sim_speed

if __name__ == "__main__":
    with_gateway = "--gateway-latency" in sys.argv[1:]
    sys.argv = [a for a in sys.argv if a != "--gateway-latency"]
    sim_speed.main()
    if with_gateway:
        from bench import gateway_latency

        gateway_latency.main([])
