"""Recordings that are damaged, cut short or disagree with the model; and every refusal of `alloctrace record`."""
from __future__ import annotations

import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from alloctrace.cli import main
from alloctrace.traces.errors import UserError
from alloctrace.traces.sources.record import build
from alloctrace.traces.sources.record import run
from alloctrace.traces.sources.record.source import RecordingSource
from alloctrace.traces.sources.record.stream import RecordingError
from alloctrace.traces.util import cbuild

DATA = Path(__file__).parents[1].joinpath("data") / "record"
MLP = (DATA / "gallocr-mlp.atrec").read_text()  # three graphs: mlp(4), mlp(16), mlp(4) in one gallocr
SIMPLE = "import ggml  # the recorder needs no ggml call to run\n"


def read(text: str):
    return RecordingSource().read(io.BytesIO(text.encode()), filename="r.atrec", name=None)


def graphs_of(text: str):
    (trace,) = read(text)
    return list(trace.graphs)


def test_the_fixture_replays_consistently():
    graphs = graphs_of(MLP)
    assert [g.role for g in graphs] == ["eval"] * 3
    assert all(g.consistent for g in graphs)
    assert [g.extra["replanned"] for g in graphs] == [True, True, False]  # bigger batch re-plans, smaller fits
    sizes = [g.buffer_size for g in graphs]
    assert sizes[1] > sizes[0] and sizes[2] == sizes[1]  # the buffer only grows


def test_a_moved_placement_makes_its_graph_inconsistent():
    lines = MLP.splitlines()
    k = next(i for i, ln in enumerate(lines) if ln.startswith("P 3 "))
    f = lines[k].split()
    f[4] = hex(int(f[4], 16) + 32)  # 32 bytes further than ggml put it
    lines[k] = " ".join(f)
    graphs = graphs_of("\n".join(lines) + "\n")
    assert [g.consistent for g in graphs] == [True, False, True]
    assert "offset model" in graphs[1].extra["mismatches"][0]


def test_a_wrong_buffer_size_makes_its_graph_inconsistent():
    text = MLP.replace("R 4 1 17408", "R 4 1 17440").replace("R 3 1 17408", "R 3 1 17440")
    graphs = graphs_of(text)
    assert not graphs[1].consistent and "buffer 0 size: model 17,408, ggml 17,440" in graphs[1].extra["mismatches"]


def test_a_program_that_died_inside_a_call_keeps_the_calls_before():
    """Cut inside the third graph's dump, as an abort after a partial write leaves it."""
    cut = MLP.index("C 5 alloc_graph")
    head = MLP[:cut] + MLP[cut:].split("\n")[0] + "\n" + "\n".join(MLP[cut:].split("\n")[1:4]) + "\nX 6\n"
    (trace,) = read(head)
    graphs = list(trace.graphs)
    assert len(graphs) == 2 and all(g.consistent for g in graphs)
    assert trace.report["signal"] == 6
    assert "cut short" in trace.report["skipped"][0]


@pytest.mark.parametrize("text,message", [
    ("hello\n", "not a recording"),
    ("ATREC 2 1\n", "unsupported recording version"),
    ("ATREC 1 5\nQ what\n", "unknown line kind"),
    ("ATREC 1 5\nC 1 alloc_graph 0x1 0x2 0\ng 1 1 0\nn 0x3 f32\n", "short tensor line"),
    ("ATREC 1 5\n", "no ggml allocator calls were seen"),
])
def test_bad_recordings_are_one_clear_error(text, message):
    with pytest.raises(RecordingError, match=message):
        read(text)


def test_a_graph_pointing_outside_itself_is_refused():
    lines = MLP.splitlines()
    k = next(i for i, ln in enumerate(lines) if ln.startswith("n "))
    f = lines[k].split(" ")
    f[20] = "0xdead"  # its first source: a tensor the recording lacks
    lines[k] = " ".join(f)
    with pytest.raises(RecordingError, match="points at a tensor the recording lacks"):
        read("\n".join(lines) + "\n")


def test_the_source_sniffs_recordings():
    src = RecordingSource()
    assert src.name == "recording"
    assert src.sniff(MLP.encode()[:64]) and not src.sniff(b"ggml_gallocr_alloc_graph: ...")


# --- the command -------------------------------------------------------------------------------------------
def test_no_compiler_is_one_line(monkeypatch, tmp_path):
    """Without the install-time recorder and without a compiler: one line that says how to fix the install."""
    monkeypatch.setattr(cbuild, "installed_path", lambda *a: tmp_path / "missing.so")
    monkeypatch.setattr(cbuild, "_PRELOADS", {})
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(UserError, match="no C compiler .* is found to build it: reinstall alloctrace") as e:
        build.recorder_library()
    assert "\n" not in str(e.value)


def test_the_recorder_is_the_one_installed_in_the_package(monkeypatch, tmp_path):
    """`pip install -e .` (and `pip install .`) built it beside its source: nothing is compiled on use."""
    monkeypatch.setattr(cbuild, "_PRELOADS", {})
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    path = build.recorder_library()
    assert path == cbuild.installed_path(build.SOURCE, "recorder", cbuild.RECORDER_FLAGS).resolve()
    assert path.parent == build.SOURCE.parent.resolve()


def test_non_linux_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(run.sys, "platform", "darwin")
    with pytest.raises(UserError, match="Linux only"):
        run.run_recorded(["true"], Path("/nonexistent.so"), tmp_path)


def test_a_static_program_is_refused_with_the_remedy(tmp_path, capsys):
    cc = shutil.which("cc") or shutil.which("gcc")
    src = tmp_path / "s.c"
    src.write_text("int main(void) { return 0; }\n")
    exe = tmp_path / "static"
    if not cc or subprocess.run([cc, "-static", "-o", str(exe), str(src)], capture_output=True).returncode:
        pytest.skip("no static C toolchain")
    assert run.is_static_elf(str(exe)) and not run.is_static_elf(sys.executable)
    assert main(["record", "-o", str(tmp_path / "r"), "--", str(exe)]) == 2
    assert "-DBUILD_SHARED_LIBS=ON" in capsys.readouterr().err


def test_missing_program_and_no_ggml_calls(tmp_path, capsys):
    assert main(["record", "-o", str(tmp_path / "r"), "--", str(tmp_path / "nope")]) == 2
    assert "program not found" in capsys.readouterr().err
    # a program that runs fine but never allocates a graph: its status if it failed, else 2
    assert main(["record", "-o", str(tmp_path / "r"), "--", sys.executable, "-c", "raise SystemExit(3)"]) == 3
    assert main(["record", "-o", str(tmp_path / "r"), "--", sys.executable, "-c", SIMPLE]) == 2
    assert "-DBUILD_SHARED_LIBS=ON" in capsys.readouterr().err
    assert main(["record"]) == 2


def test_exit_status_passes_through_and_the_trace_is_stored(tmp_path, capfd):
    prog = tmp_path / "p.py"
    prog.write_text((DATA / "exit3.py").read_text())
    rc = main(["record", "--store", str(tmp_path / "s"), "--name", "three", "--", sys.executable, str(prog)])
    assert rc == 3
    out, err = capfd.readouterr()
    assert out == "the program's own output\n"  # untouched; our table goes to stderr
    assert "three" in err and "yes" in err


def test_ggml_include_reads_tensors_with_the_users_header(tmp_path, capsys):
    prog = tmp_path / "p.py"
    prog.write_text((DATA / "exit3.py").read_text())
    out = tmp_path / "r.atrec"
    assert main(["record", "--ggml-include", str(DATA), "-o", str(out), "--", sys.executable, str(prog)]) == 3
    assert "layout ggml.h" in out.read_text()
    assert all(g.consistent for g in graphs_of(out.read_text()))
    # a header of another ggml (a tensor with a grad member): refused, with the remedy
    wrong = tmp_path / "old" / "ggml.h"
    wrong.parent.mkdir()
    wrong.write_text((DATA / "ggml.h").read_text().replace(
        "    struct ggml_tensor * src[GGML_MAX_SRC];", "    struct ggml_tensor * grad;\n"
        "    struct ggml_tensor * src[GGML_MAX_SRC];"))
    assert main(["record", "--ggml-include", str(wrong), "--store", str(tmp_path / "s"), "--",
                 sys.executable, str(prog)]) == 2
    assert "does not match" in capsys.readouterr().err
    assert main(["record", "--ggml-include", str(tmp_path / "none"), "--", "true"]) == 2


def _as_reference(text: str, seq: int, prev: int) -> str:
    """Call `seq`'s graph written as the recorder writes a repeat of call `prev`'s."""
    out, skipping = [], False
    for ln in text.splitlines():
        if ln.startswith(f"g {seq} "):
            out.append(f"{ln} ={prev}")
            skipping = True
            continue
        if skipping and ln[:1] in ("l", "n", "x", "i", "j") and ln[1:2] == " ":
            continue
        skipping = False
        out.append(ln)
    return "\n".join(out) + "\n"


def test_a_repeated_graph_is_read_from_the_previous_dump():
    """Call 4 (the re-plan inside alloc_graph 3) plans the very graph call 3 dumped."""
    text = _as_reference(MLP, 4, 3)
    assert len(text) < len(MLP)
    before, after = graphs_of(MLP), graphs_of(text)
    assert [(g.consistent, g.buffer_size, g.extra["replanned"]) for g in after] == \
           [(g.consistent, g.buffer_size, g.extra["replanned"]) for g in before]


def test_a_reference_to_a_graph_not_dumped_last_is_refused():
    with pytest.raises(RecordingError, match="did not record last"):
        read(_as_reference(MLP, 4, 1))


def test_a_buffer_type_no_T_line_describes_is_one_error():
    """Before: a KeyError traceback from the replay."""
    text = "\n".join(ln for ln in MLP.splitlines() if not ln.startswith("T ")) + "\n"
    with pytest.raises(RecordingError, match="no T line"):
        read(text)


def test_lines_read_a_block_at_a_time_are_the_lines_read_one_at_a_time(monkeypatch):
    """stream._lines reads blocks; lines cut across blocks, a cut last line, long lines and the byte limit come
    out as reading line by line gives them."""
    import io as _io

    from alloctrace.traces.sources.record import stream

    text = b"ATREC 1 5\nab\n\nc d \xff\r\n" + b"x" * 50 + b"\nlast, cut"
    monkeypatch.setattr(stream, "READ_BLOCK", 1 << 20)
    whole = list(stream._lines(_io.BytesIO(text), 1 << 20))
    assert whole == [(1, "ATREC 1 5"), (2, "ab"), (3, ""), (4, "c d \ufffd\r"), (5, "x" * 50)]
    for block in (1, 2, 3, 7, 64):
        monkeypatch.setattr(stream, "READ_BLOCK", block)
        assert list(stream._lines(_io.BytesIO(text), 1 << 20)) == whole
        monkeypatch.setattr(stream, "MAX_LINE", 50)
        with pytest.raises(stream.RecordingError, match="line 5: longer than 50 bytes"):
            list(stream._lines(_io.BytesIO(text), 1 << 20))
        monkeypatch.setattr(stream, "MAX_LINE", 1 << 24)
        with pytest.raises(stream.RecordingError, match="larger than 20 bytes"):
            list(stream._lines(_io.BytesIO(text), 20))
