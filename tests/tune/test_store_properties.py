"""Property: whatever a store file holds, reading it loses nothing and raises nothing unexpected.

Random files are built from lines of known kinds (valid rows, rows with a field
of the wrong type, junk text, huge numbers, bytes that are not UTF-8, blank
lines), ending in a newline, a torn row, or a whole row without its newline. Loading must either keep exactly the
valid rows, in order, naming the lines it skipped, or fail with a one-line
`MoetuneError` naming the file; appending afterwards must keep every byte of
the file but a torn tail.
"""

import json
import warnings

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moetune.errors import MoetuneError
from moetune.kernel.config import Candidate
from moetune.tune.store import STORE_FILENAME, Measurement, ResultStore

SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
POW2 = st.sampled_from([16, 32, 64, 128, 256])

candidates = st.builds(
    Candidate,
    POW2,
    POW2,
    POW2,
    st.sampled_from([1, 16, 32, 64]),
    st.sampled_from([4, 8]),
    st.integers(1, 6),
)
latencies = st.floats(min_value=0.0, max_value=1e12, allow_nan=False, allow_infinity=False)


@st.composite
def measurements(draw):
    ok = draw(st.booleans())
    latency = draw(latencies) if ok else None
    return Measurement(
        problem_key=draw(st.sampled_from(["E=8,N=32,K=64,topk=2,dtype=bf16", "k"])),
        batch_size=draw(st.integers(1, 2**40)),
        candidate=draw(candidates),
        fidelity=draw(st.sampled_from(["quick", "full"])),
        status="ok" if ok else draw(st.sampled_from(["compile_error", "environment", "timeout"])),
        latency_us=latency,
        p20_us=latency,
        p80_us=latency,
        compile_s=draw(st.none() | latencies),
        error=None if ok else draw(st.text(max_size=30)),
        device_name=draw(st.text(max_size=12)),
        triton_version="3.9.0",
        moetune_version="0.1.0",
        timestamp=draw(latencies),
    )


def encode(measurement):
    return json.dumps(measurement.to_json(), separators=(",", ":")).encode()


# Values no field accepts where they are put.
WRONG = {
    "batch_size": st.sampled_from(["64", 0, -3, 2.5, True, None, [1]]),
    "latency_us": st.sampled_from(["fast", [], {}, True, -1.0]),
    "status": st.sampled_from([1, None, "great", ""]),
    "candidate": st.sampled_from([None, "M16", {"BLOCK_SIZE_M": 16}, [16, 16]]),
    "timestamp": st.sampled_from([None, "now"]),
    "use_tma": st.sampled_from([0, "yes", None]),
}


@st.composite
def bad_rows(draw):
    data = draw(measurements()).to_json()
    field = draw(st.sampled_from(sorted(WRONG)))
    data[field] = draw(WRONG[field])
    return json.dumps(data).encode()


huge_numbers = st.sampled_from(
    [b'{"latency_us": 1e999}', b"9" * 5000, b"-1e400", b"[" * 5000 + b"]" * 5000, b"NaN"]
)
junk = st.binary(max_size=60).map(lambda b: b.replace(b"\n", b" "))
not_utf8 = st.sampled_from([b"\xff\xfe\xfa", b'{"problem_key": "\xc3\x28"}', b"\x80abc"])

# (bytes of one line without its newline, whether it is a valid row)
lines = st.one_of(
    measurements().map(lambda m: (encode(m), m)),
    bad_rows().map(lambda b: (b, None)),
    junk.map(lambda b: (b, None)),
    huge_numbers.map(lambda b: (b, None)),
    not_utf8.map(lambda b: (b, None)),
    st.just((b"", None)),
)


@st.composite
def store_files(draw):
    chosen = draw(st.lists(lines, max_size=10))
    body = b"".join(text + b"\n" for text, _ in chosen)
    expected = [m for _, m in chosen if m is not None]
    skipped = [n for n, (text, m) in enumerate(chosen, start=1) if m is None and text.strip()]
    tail, kept = b"", b""
    ending = draw(st.sampled_from(["newline", "torn", "whole"]))
    if ending != "newline":
        last = draw(measurements())
        whole = encode(last)
        if ending == "torn":  # a write killed half way: a row cut short, never whole JSON
            tail = whole[: draw(st.integers(1, len(whole) - 1))]
        else:  # a whole row that lost its newline: kept, and fenced before the next one
            tail, kept = whole, whole + b"\n"
            expected.append(last)
    return body, tail, kept, expected, skipped


@SETTINGS
@given(store_files(), measurements())
def test_a_store_file_loads_its_valid_rows_and_appends_without_losing_a_byte(
    tmp_path_factory, file, new
):
    body, tail, kept, expected, skipped = file
    path = tmp_path_factory.mktemp("store") / STORE_FILENAME
    path.write_bytes(body + tail)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            store = ResultStore(path)
        except MoetuneError as exc:  # allowed, if it is one line naming the file
            assert "\n" not in str(exc) and str(path) in str(exc)
            assert path.read_bytes() == body + tail
            return
    assert store.all() == expected
    assert store.skipped == skipped
    messages = [str(w.message) for w in caught]
    if skipped:
        assert any(message.startswith(f"{path}:{skipped[0]}: skipping") for message in messages)
    assert all("\n" not in message for message in messages)

    store.add(new)
    after = path.read_bytes()
    assert after.startswith(body)  # every complete line stays, byte for byte
    assert after == body + kept + encode(new) + b"\n"  # only a torn tail is gone
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert ResultStore(path).all() == [*expected, new]
