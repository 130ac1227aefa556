"""Interactive beside bulk, and a small tenant beside a large one, against a running service: the command of
siglip_serve.measure.lanes_bench (its docstring says what each window runs), kept at this path, which the
benchmark log's runs name.

    python tools/lanes_bench.py --port 8000 --key-a KEY_A --key-b KEY_B --seconds 30 --json lanes.json
"""

from siglip_serve.measure.lanes_bench import main

if __name__ == "__main__":  # the stream processes are spawned: they import this file again
    raise SystemExit(main())
