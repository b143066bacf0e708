"""Random pickles and random snapshot-shaped data: the reader either builds a trace or raises SnapshotError."""
import io
import pickle

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alloctrace.traces.store.torch_stored import ACTIONS

from alloctrace.traces.sources.torch.columns import split_devices
from alloctrace.traces.sources.torch.source import device_facts
from alloctrace.traces.sources.torch.unpickle import SnapshotError, load_plain

KEYS = ["action", "addr", "size", "stream", "time_us", "frames", "user_metadata", "device_free", "name",
        "filename", "line", "address", "total_size", "blocks", "state", "requested_size", "device", "stage",
        "segment_type", "segment_pool_id"]
scalars = (st.none() | st.booleans() | st.integers(-2, 1 << 66) | st.floats(allow_nan=True) | st.text(max_size=4)
           | st.sampled_from(ACTIONS + ("active_allocated", "inactive", "START", "END")))
plain = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.tuples(c, c)
                     | st.dictionaries(st.sampled_from(KEYS), c, max_size=8), max_leaves=40)
entry = st.fixed_dictionaries({"action": st.sampled_from(ACTIONS), "addr": st.integers(0, 64).map(lambda a: a * 512),
                               "size": st.integers(0, 1 << 16), "stream": st.just(0), "time_us": st.integers(0, 99)},
                              optional={"frames": st.lists(st.fixed_dictionaries(
                                  {"name": st.sampled_from("fgh"), "filename": st.sampled_from(["a.py", "torch/x.py"]),
                                   "line": st.integers(0, 3)}), max_size=3),
                                  "user_metadata": st.sampled_from(["", "step0", "step1"])})


def read(blob: bytes):
    try:
        devices, _ = split_devices(load_plain(io.BytesIO(blob), label="fuzz"))
        for d in devices:
            device_facts(d)
    except SnapshotError as e:
        assert "\n" not in str(e)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_random_bytes_after_a_pickle_header(data):
    read(b"\x80\x04" + data)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plain, plain, plain)
def test_random_plain_structures(segments, traces, annotations):
    read(pickle.dumps({"segments": segments, "device_traces": traces, "external_annotations": annotations}))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(entry, max_size=30), max_size=3))
def test_random_but_well_formed_entries(traces):
    """Entries of the right shape in any order (frees of unknown blocks, segments freed twice, ...): the state
    rebuild notes what does not add up instead of failing."""
    read(pickle.dumps({"segments": [], "device_traces": traces}))


def test_a_start_no_allocator_could_have_had_is_a_reason_not_a_traceback():
    """Found by the test above: two segment_unmaps of one address, then a segment_free of one never made. The
    walk back rebuilds a start (two overlapping pages) that the model's forward replay trips over; the
    device is marked not exact with that reason, as every view then says its state is unknown."""
    def e(action, addr, size):
        return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 0}

    entries = [e("segment_unmap", 31232, 1585), e("segment_unmap", 31232, 1761), e("segment_free", 21504, 281)]
    devices, _ = split_devices(load_plain(io.BytesIO(pickle.dumps({"segments": [], "device_traces": [entries]})),
                                          label="fuzz"))
    start = device_facts(devices[0])["extra"]["partial"]
    assert start["partial"] and start["exact"] is False and start["seed"] is None
    assert start["reason"].startswith("the rebuilt start does not replay")
