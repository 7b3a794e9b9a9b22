"""One line per round-4 log beside this file: seed, best epoch, dev and test root figures, wall
time (``python docs/results/round4/summary.py [--all]``)."""
import glob, os, re, sys

here = os.path.dirname(os.path.abspath(__file__))
for path in sorted(glob.glob(os.path.join(here, "r4_*.log")), key=lambda p: open(p).readline()):
    text = open(path).read()
    cmd = re.search(r"^# (python .*)$", text, re.M).group(1)
    wall = re.search(r"# wall ([\d.]+)", text)
    for m in re.finditer(r"seed (\d+): best dev epoch (\d+) of (\d+): dev (.*?); test (.*?)  \(", text):
        dev = dict(re.findall(r"(\w+) ([\d.]+)", m.group(4)))
        test = dict(re.findall(r"(\w+) ([\d.]+)", m.group(5)))
        key = "fine" if "fine" in dev else "binary"
        print(f"{os.path.basename(path)[:-4]:28s} s{m.group(1)} ep {m.group(2):>2}/{m.group(3)} dev {key} {dev[key]} "
              f"test {key} {test[key]} bin {test.get('binary')} phr {test['phrase']} "
              f"wall {wall.group(1) if wall else '-'}")
    if "--all" in sys.argv: print("   ", cmd)
