"""Print the validation and test tables (mean ± std over seeds) from results_*.jsonl."""
import json
import statistics
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).parent

for split in ("val", "test"):
    path = HERE / f"results_{split}.jsonl"
    if not path.is_file():
        continue
    runs = defaultdict(list)
    for line in path.read_text().splitlines():
        r = json.loads(line)
        runs[r["config"]].append(r)
    print(f"\n{split}: config | seeds | ε | last iterate % | EMA % | s per run")
    for name, rs in runs.items():
        def fmt(key):
            vals = [100 * r[key] for r in rs if r[key] is not None]
            if not vals:
                return "—"
            sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
            return f"{statistics.mean(vals):.2f} ± {sd:.2f}"
        print(f"{name} | {len(rs)} | {rs[0]['epsilon']} | {fmt('test_acc')} | "
              f"{fmt('test_acc_ema')} | {statistics.mean(r['wall_s'] for r in rs):.0f}")
