#!/usr/bin/env python3
"""giftc at scale against cp, in one run: encode and decode of safetensors dumps, one codec
thread (giftc --threads 1: encode then writes its output behind on a second thread where a
processor is free; run the script under `taskset -c 0` for one processor in all), page cache hot, each timed against `cp` of the same input file, and with --fsync against cp
followed by `sync` of the copy, with the peak anonymous memory (RssAnon: the process's own
memory, not the page cache of the files it maps) of each command; and beside each command
its I/O floor (io_floor, built next to giftc: the same mapping of the input and writes of an
output of the same size, without the codec), which no codec can beat. A benchmark, not a
test: it prints a table and asserts nothing.

Usage: giftc_stream_bench.py PATH/TO/giftc [--floor PATH/TO/io_floor] [--dir DIR]
                             [--sizes 512M,6G] [--repeat 3] [--many N]
DIR (default: a folder under $TMPDIR) needs about 3.5x the largest size free. With --many N,
also a dump of N tensors of 4 x 4 (a model of many experts, say): every command's time and
RssAnon against cp, where memory grows with the number of tensors.
"""
import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import tempfile
import time

import numpy as np


def write_dump(path, total_bytes, dtype):
    """A safetensors file of 4096 x 4096 tensors of `dtype`, written tensor by tensor."""
    width = 4 if dtype == "F32" else 2
    per = 4096 * 4096 * width
    count = max(1, total_bytes // per)
    header = {f"layers.{i}.weight": {"dtype": dtype, "shape": [4096, 4096],
                                     "data_offsets": [i * per, (i + 1) * per]}
              for i in range(count)}
    js = json.dumps(header).encode()
    js += b" " * ((8 - (8 + len(js)) % 8) % 8)
    rng = np.random.default_rng(1)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js)
        for _ in range(count):
            x = rng.standard_normal((4096, 4096), dtype=np.float32) * np.float32(1e-3)
            if dtype == "BF16":
                x = (x.view(np.uint32) >> 16).astype(np.uint16)  # truncation is fine for data
            f.write(x.tobytes())
    return count * per


def write_many(path, count):
    """A safetensors file of `count` fp32 tensors of 4 x 4."""
    per = 64
    header = {f"experts.{i}.weight": {"dtype": "F32", "shape": [4, 4],
                                      "data_offsets": [i * per, (i + 1) * per]}
              for i in range(count)}
    js = json.dumps(header).encode()
    js += b" " * ((8 - (8 + len(js)) % 8) % 8)
    x = np.random.default_rng(2).standard_normal(count * 16, dtype=np.float32)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js + x.tobytes())


def many_table(giftc, work, count, repeat):
    """Every command on a dump of `count` small tensors, against cp of it."""
    src = os.path.join(work, f"many-{count}.safetensors")
    frame, out, copy = src + ".gift", src + ".out.safetensors", src + ".copy"
    rm = lambda *paths: [os.path.exists(p) and os.unlink(p) for p in paths]
    encoded = frame + ".new"
    rm(frame, encoded, out, copy)  # a failed run's, left in --dir
    write_many(src, count)
    subprocess.run([giftc, "encode", src, "-o", frame, "-q"], check=True)
    names = ["cp", "encode", "decode", "inspect", "inspect --json", "compare", "compare --json"]
    results = interleaved_runs([
        (["cp", src, copy], lambda: rm(copy)),
        ([giftc, "encode", src, "-o", encoded, "-q"], lambda: rm(encoded)),
        ([giftc, "decode", frame, "-o", out, "-q"], lambda: rm(out)),
        ([giftc, "inspect", frame], lambda: None),
        ([giftc, "inspect", "--json", frame], lambda: None),
        ([giftc, "compare", src, frame], lambda: None),
        ([giftc, "compare", "--json", src, frame], lambda: None),
    ], repeat)
    print(f"\n{count} tensors of 4 x 4 fp32 ({os.path.getsize(src) / 2**20:.1f} MiB, frame "
          f"{os.path.getsize(frame) / 2**20:.1f} MiB), all threads, median of {repeat}:")
    print("| command | s (x cp) | RssAnon MiB | RssAnon bytes a tensor |")
    print("|---|---|---|---|")
    cp_t = results[0][0]
    for name, (t, m, _) in zip(names, results):
        print(f"| {name} | {t:.3f} ({t / cp_t:.1f}) | {m:.1f} | {m * 2**20 / count:.0f} |")
    rm(src, frame, encoded, out, copy)


def measure(cmd):
    """Wall time and peak RssAnon (sampled every millisecond) of one command."""
    start = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    status = f"/proc/{p.pid}/status"
    while p.poll() is None:
        try:
            with open(status) as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        peak = max(peak, int(line.split()[1]))
        except OSError:
            pass
        time.sleep(0.001)
    wall = time.perf_counter() - start
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {p.stderr.read().decode()}")
    return wall, peak / 1024.0


def interleaved_runs(commands, repeat):
    """Each (cmd, after) in turn, `repeat` rounds: this VM's speed drifts over seconds, so
    every command sees the same drift. after() removes what the command wrote, before the next
    command runs. Per command: median time, peak RssAnon, fastest time."""
    times = [[] for _ in commands]
    peaks = [0.0 for _ in commands]
    for _ in range(repeat):
        for i, (cmd, after) in enumerate(commands):
            t, m = measure(cmd)
            after()
            times[i].append(t)
            peaks[i] = max(peaks[i], m)
    return [(statistics.median(t), p, min(t)) for t, p in zip(times, peaks)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("giftc")
    ap.add_argument("--floor", default=None,
                    help="io_floor (default: tests/bench/io_floor in giftc's build tree)")
    ap.add_argument("--dir", default=None,
                    help="folder for the dumps and outputs (each removed once timed), made if "
                         "missing (default: a temporary folder, removed at the end)")
    ap.add_argument("--sizes", default="512M,6G",
                    help="dump sizes, comma-separated, in M or G (default: 512M,6G; past 1G F32 only)")
    ap.add_argument("--dtypes", default="F32,BF16", help="dump dtypes (default: F32,BF16)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="interleaved rounds; medians and fastest of them (default: 3)")
    ap.add_argument("--many", type=int, default=0,
                    help="also a dump of this many tensors of 4 x 4 (default: none)")
    a = ap.parse_args()
    floor = a.floor or os.path.join(os.path.dirname(os.path.abspath(a.giftc)), os.pardir, "tests",
                                    "bench", "io_floor")
    if not os.access(floor, os.X_OK):
        raise SystemExit(f"{floor}: no io_floor there (build the io_floor target, or name it "
                         "with --floor)")
    if a.dir:
        os.makedirs(a.dir, exist_ok=True)
    work = a.dir or tempfile.mkdtemp(prefix="giftc-bench-")
    units = {"M": 1 << 20, "G": 1 << 30}
    sizes = a.sizes.split(",")
    for size in sizes:
        if not (size[:-1].isdigit() and size[-1:] in units and int(size[:-1]) > 0):
            ap.error(f"--sizes: {size!r} is not a size such as 512M or 6G")
    for dtype in a.dtypes.upper().split(","):
        if dtype not in ("F32", "BF16"):
            ap.error(f"--dtypes: {dtype!r} is not F32 or BF16")
    rows, fastest = [], []
    for size in sizes:
        nbytes = int(size[:-1]) * units[size[-1]]
        for dtype in a.dtypes.upper().split(","):
            if nbytes > (1 << 30) and dtype != "F32":
                continue  # the large run shows memory growth; one dtype is enough
            src = os.path.join(work, f"dump-{size}-{dtype}.safetensors")
            frame, out, copy = src + ".gift", src + ".out.safetensors", src + ".copy"
            rm = lambda *paths: [os.path.exists(p) and os.unlink(p) for p in paths]
            # An output written to disk (--fsync, cp+sync) and then removed has its blocks
            # discarded at the journal's next commit where the file system is mounted with
            # discard (as this VM's / is), during whichever command runs then: synced here.
            # (Outputs past the kernel's dirty limits, at 6G, are written back as they are made
            # and may still leave discards to the next command.)
            rm_synced = lambda *paths: (rm(*paths), os.sync())
            # A failed run's, left in --dir: gone before the dump takes their room.
            rm_synced(frame, out, copy, frame + ".new")
            real = write_dump(src, nbytes, dtype)
            subprocess.run(["cat", src], stdout=subprocess.DEVNULL, check=True)  # hot cache
            # The frame decode reads, made once up front.
            subprocess.run([a.giftc, "encode", src, "-o", frame, "-q"], check=True)
            encoded = frame + ".new"
            # The floors write outputs of the commands' sizes: the decoded dump's, made once.
            subprocess.run([a.giftc, "decode", frame, "-o", out, "-q"], check=True)
            decoded_bytes = os.path.getsize(out)
            rm(out)
            # giftc leaves its outputs to the kernel's writeback, as cp does; with --fsync it
            # syncs each one before naming it, and the like-for-like copy syncs too. Every
            # command writes a new file, as cp does (replacing one costs freeing it), removed
            # once timed, before the next command runs.
            enc = [a.giftc, "encode", src, "-o", encoded, "--threads", "1", "-q"]
            dec = [a.giftc, "decode", frame, "-o", out, "--threads", "1", "-q"]
            (cp_t, cp_m, cp_min), (sync_t, _, sync_min), (enc_t, enc_m, enc_min), \
                (encs_t, _, encs_min), (dec_t, dec_m, dec_min), (decs_t, _, decs_min), \
                (encf_t, _, encf_min), (decf_t, _, decf_min) = \
                interleaved_runs([
                    (["cp", src, copy], lambda: rm(copy)),
                    (["sh", "-c", 'cp "$1" "$2" && sync "$2"', "sh", src, copy],
                     lambda: rm_synced(copy)),
                    (enc, lambda: rm(encoded)),
                    (enc + ["--fsync"], lambda: rm_synced(encoded)),
                    (dec, lambda: rm(out)),
                    (dec + ["--fsync"], lambda: rm_synced(out)),
                    ([floor, src, encoded, str(os.path.getsize(frame))], lambda: rm(encoded)),
                    ([floor, frame, out, str(decoded_bytes)], lambda: rm(out)),
                ], a.repeat)
            rows.append((f"{size} {dtype}", real, os.path.getsize(frame), cp_t, sync_t, cp_m,
                         enc_t, encs_t, enc_m, dec_t, decs_t, dec_m, encf_t, decf_t))
            fastest.append((f"{size} {dtype}", cp_min, sync_min, enc_min, encs_min, dec_min,
                            decs_min, encf_min, decf_min))
            rm(src, frame, encoded, out, copy)
    if not a.dir:
        shutil.rmtree(work, ignore_errors=True)
    print(f"giftc {subprocess.run([a.giftc, '--version'], capture_output=True, text=True).stdout.strip()}"
          f", one codec thread on {len(os.sched_getaffinity(0))} processor(s), page cache hot, "
          f"median of {a.repeat} interleaved rounds; RssAnon: peak sampled every ms")
    print("| dump | frame | cp s | cp+sync s | encode s (x cp) | encode --fsync s (x cp+sync) "
          "| encode RssAnon MiB | decode s (x cp) | decode --fsync s (x cp+sync) "
          "| decode RssAnon MiB | cp RssAnon MiB | encode's I/O floor s (x cp) "
          "| decode's I/O floor s (x cp) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (name, real, fb, cp_t, sync_t, cp_m, enc_t, encs_t, enc_m, dec_t, decs_t, dec_m, encf_t,
         decf_t) in rows:
        print(f"| {name} ({real / 2**20:.0f} MiB) | {fb / 2**20:.0f} MiB | {cp_t:.3f} "
              f"| {sync_t:.3f} | {enc_t:.3f} ({enc_t / cp_t:.2f}) "
              f"| {encs_t:.3f} ({encs_t / sync_t:.2f}) | {enc_m:.1f} "
              f"| {dec_t:.3f} ({dec_t / cp_t:.2f}) | {decs_t:.3f} ({decs_t / sync_t:.2f}) "
              f"| {dec_m:.1f} | {cp_m:.1f} | {encf_t:.3f} ({encf_t / cp_t:.2f}) "
              f"| {decf_t:.3f} ({decf_t / cp_t:.2f}) |")
    # Writes on a shared VM can take several times longer now and then: the fastest of the
    # runs shows each command's own cost.
    print(f"\nFastest of {a.repeat}:")
    print("| dump | cp s | cp+sync s | encode s (x cp) | encode --fsync s (x cp+sync) "
          "| decode s (x cp) | decode --fsync s (x cp+sync) | encode's I/O floor s (x cp) "
          "| decode's I/O floor s (x cp) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, cp_t, sync_t, enc_t, encs_t, dec_t, decs_t, encf_t, decf_t in fastest:
        print(f"| {name} | {cp_t:.3f} | {sync_t:.3f} | {enc_t:.3f} ({enc_t / cp_t:.2f}) "
              f"| {encs_t:.3f} ({encs_t / sync_t:.2f}) | {dec_t:.3f} ({dec_t / cp_t:.2f}) "
              f"| {decs_t:.3f} ({decs_t / sync_t:.2f}) | {encf_t:.3f} ({encf_t / cp_t:.2f}) "
              f"| {decf_t:.3f} ({decf_t / cp_t:.2f}) |")
    if a.many > 0:
        work = a.dir or tempfile.mkdtemp(prefix="giftc-bench-")
        many_table(a.giftc, work, a.many, a.repeat)
        if not a.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
