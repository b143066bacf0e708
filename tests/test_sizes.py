"""One size formatter: every face writes a size the same way (traces/util/sizes.py)."""
from alloctrace.traces.util.sizes import fmt_bytes


def test_sizes_read_the_same_everywhere():
    assert fmt_bytes(None) == "-"
    assert fmt_bytes(0) == "0 B" and fmt_bytes(1023) == "1023 B"
    assert fmt_bytes(1536) == "1.50 KiB"
    assert fmt_bytes(3 << 19) == "1.50 MiB"
    assert fmt_bytes(3 << 29) == "1.50 GiB"  # check said "1.5 GiB", explain "1.50 GiB" for this one
    assert fmt_bytes(-(3 << 29)) == "-1.50 GiB"
    assert fmt_bytes(5 << 40) == "5.00 TiB"
