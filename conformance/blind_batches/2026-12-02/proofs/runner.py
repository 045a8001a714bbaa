"""Run every proof in one process (imports once). Usage: python runner.py [p01 p02 ...]"""
import glob, os, runpy, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
names = sys.argv[1:] or sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(os.path.dirname(__file__), "p[0-9]*.py")))
summary = []
for n in names:
    t0 = time.monotonic()
    try:
        runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), n + ".py"), run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code
    except Exception as e:
        print(f"[{n}] proof crashed: {type(e).__name__}: {e}"); code = 2
    summary.append((n, code, round(time.monotonic() - t0, 1)))
    print(f"=== {n}: {'DEMONSTRATED' if code == 0 else 'NOT DEMONSTRATED'} ({summary[-1][2]} s)", flush=True)
print("\nSUMMARY"); [print(*s) for s in summary]
