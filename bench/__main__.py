"""Run every benchmark and print its figures."""

from bench import sim_speed

if __name__ == "__main__":
    sim_speed.main()
