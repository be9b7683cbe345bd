#!/usr/bin/env python3
"""Rewrites CUDA kernel launches for the CPU emulation (cuda_emulation.hpp):
    kernel<<<grid, block, shared, stream>>>(args);
becomes
    ::emu::launch(::emu::Config(grid, block, shared, stream), [=] { kernel(args); });
Usage: unchevron.py IN OUT. Everything else is copied unchanged."""
import re
import sys


def matching(text, start, open_ch, close_ch):
    """Index just past the bracket closing the one at `start`."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_ch:
            depth += 1
        elif text[i] == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
    raise SystemExit(f"unbalanced {open_ch}{close_ch} after offset {start}")


def rewrite(text):
    out, pos = [], 0
    while True:
        at = text.find("<<<", pos)
        if at < 0:
            out.append(text[pos:])
            return "".join(out)
        # The kernel: an identifier, optionally with template arguments.
        head = re.search(r"([A-Za-z_][\w:]*\s*(<[^;{}()]*>)?)\s*$", text[pos:at])
        if not head:
            raise SystemExit(f"no kernel name before <<< at offset {at}")
        name_start = pos + head.start(1)
        end_cfg = text.index(">>>", at)
        config = text[at + 3:end_cfg]
        paren = text.index("(", end_cfg)
        close = matching(text, paren, "(", ")")
        args = text[paren + 1:close - 1]
        out.append(text[pos:name_start])
        out.append(f"::emu::launch(::emu::Config({config}), [=] {{ {head.group(1).strip()}({args}); }})")
        pos = close


if __name__ == "__main__":
    src, dst = sys.argv[1], sys.argv[2]
    with open(src) as f:
        text = f.read()
    with open(dst, "w") as f:
        f.write(f"// Generated from {src} by unchevron.py for the CPU emulation.\n")
        f.write(rewrite(text))
