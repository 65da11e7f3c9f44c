"""Fuzzing (hypothesis, derandomized: the same examples every run): every znode decoder, every name validator and
the CLI against a real ZooKeeper. Nothing but a ``TidemarkError`` may ever come out, and the CLI always ends in
one line and a documented exit status."""
from __future__ import annotations

import importlib
import io
import json
import pkgutil
import re
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import coordinator
from coordinator import CatalogSettings, CorruptState, InvalidName, Tidemark
from coordinator.names import MAX_EPOCH_MS, MAX_NAME_LENGTH, parse_epoch, validate_epoch, validate_name, validate_names
from coordinator.operations.cli import main
from coordinator.records import JsonRecord, now_ms
from coordinator.serving.hold import Hold
from coordinator.zookeeper.paths import Paths
from tests.helpers.lake import commit_rows, create_table, lead_job

FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=300,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
FUZZ_EACH = settings(FUZZ, max_examples=200)  # per record class
STRICT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")


def record_classes() -> list[type]:
    """Every record class of the package (every module imported first: a subclass exists once its module is)."""
    for module in pkgutil.walk_packages(coordinator.__path__, "coordinator."):
        importlib.import_module(module.name)
    found, todo = [], list(JsonRecord.__subclasses__())
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return sorted(set(found), key=lambda c: c.__name__)


def test_every_record_class_is_fuzzed():
    names = {c.__name__ for c in record_classes()}
    assert {"BarrierGrid", "EpochRecord", "TableTidemark", "JobRecord", "TermRecord", "ReaderPins",
            "VersionRecord"} <= names


# -- znode decoders ----------------------------------------------------------------------------------------

edge_ints = st.sampled_from([0, -1, 1, 2 ** 31, 2 ** 63 - 1, 2 ** 63, -2 ** 63 - 1, 10 ** 30, MAX_EPOCH_MS,
                             MAX_EPOCH_MS + 1, 1_700_000_000_000])
scalars = (st.none() | st.booleans() | st.integers() | edge_ints | st.floats(allow_nan=True)
           | st.text(max_size=20) | st.sampled_from(["STARTED", "COMMITTED", "processing-time", "consistent"]))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8) | st.sampled_from(["start", "end", "sources"]),
                                             inner, max_size=4), max_leaves=12)


def shaped(cls) -> st.SearchStrategy:
    """Objects with the record's own field names (any subset) and arbitrary values: past the first checks."""
    return st.fixed_dictionaries({}, optional={f.name: json_values for f in fields(cls)})


def decode(cls, raw: bytes) -> None:
    try:
        record = cls.from_json(raw, "/fuzz")
    except CorruptState:
        return
    assert isinstance(record, cls)
    assert cls.from_json(record.to_json(), "/fuzz") == record  # whatever decodes also encodes, identically


@pytest.mark.parametrize("cls", record_classes(), ids=lambda c: c.__name__)
@FUZZ_EACH
@given(data=st.data())
def test_decoders_raise_only_corrupt_state(cls, data):
    raw = data.draw(st.one_of(st.binary(max_size=64), json_values.map(lambda v: json.dumps(v).encode()),
                              shaped(cls).map(lambda v: json.dumps(v).encode())))
    decode(cls, raw)


@pytest.mark.parametrize("cls", record_classes(), ids=lambda c: c.__name__)
def test_decoders_survive_deep_nesting(cls):
    for raw in (b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000):
        with pytest.raises(CorruptState):
            cls.from_json(raw, "/fuzz")


# -- name and epoch validators -----------------------------------------------------------------------------

@FUZZ
@given(text=st.one_of(st.text(max_size=40), st.text(alphabet="0123456789abcdefx.-+ ", max_size=40),
                      st.builds(lambda e, s, d, t: f"{e}.{s}.{s + d}.{t:x}", st.integers(0, 2 ** 62),
                                st.integers(0, 2 ** 50), st.integers(0, 10 ** 6), st.integers(0, 2 ** 64 - 1))))
def test_a_hold_cookie_decodes_to_nothing_or_to_a_hold_that_encodes_back(text):
    """A client writes its cookie as it likes: the server reads a hold it could have written, or none."""
    hold = Hold.decode(text)
    assert hold is None or Hold.decode(hold.encode()) == hold


@FUZZ
@given(name=st.one_of(st.text(max_size=30), st.text(alphabet="ab.-_\n\t /²0", max_size=12),
                      st.from_regex(STRICT_NAME, fullmatch=True), st.integers(), st.none(), st.binary(max_size=4)))
def test_name_validators(name):
    try:
        accepted = validate_name(name, "job name")
    except InvalidName:
        return
    assert STRICT_NAME.fullmatch(accepted) and ".." not in accepted and len(accepted) <= MAX_NAME_LENGTH
    paths = Paths("/tidemark")
    assert paths.job(accepted) == f"/tidemark/jobs/{accepted}"
    assert paths.tidemark(accepted).split("/") == ["", "tidemark", "tables", accepted, "tidemark"]


@FUZZ
@given(names=st.one_of(st.lists(st.text(alphabet="ab.\n²", max_size=4), max_size=4), st.text(max_size=4),
                       st.integers(), st.none(), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)))
def test_name_list_validator(names):
    try:
        checked = validate_names(names, "table name")
    except InvalidName:
        return
    assert list(checked) == sorted(set(checked)) and all(STRICT_NAME.fullmatch(n) for n in checked)


@FUZZ
@given(root=st.one_of(st.text(max_size=20), st.text(alphabet="/a.\n²", max_size=8), st.integers(), st.none()))
def test_root_validator(root):
    try:
        paths = Paths(root)
    except InvalidName:
        return
    assert paths.topology.startswith(paths.root.rstrip("/") + "/")


@FUZZ
@given(value=st.one_of(st.integers(), edge_ints, st.floats(), st.booleans(), st.text(max_size=5)),
       segment=st.one_of(st.text(max_size=20), st.text(alphabet="0123456789²١", max_size=20)))  # noqa: RUF001 - non-ASCII digits on purpose
def test_epoch_validators(value, segment):
    try:
        assert 0 <= validate_epoch(value) <= MAX_EPOCH_MS
    except InvalidName:
        pass
    parsed = parse_epoch(segment)
    assert parsed is None or (0 <= parsed <= MAX_EPOCH_MS and str(parsed) == segment.lstrip("0").rjust(1, "0"))
    if parsed is not None:
        assert parse_epoch(str(parsed)) == parsed


# -- the CLI, in-process, against a real ZooKeeper -----------------------------------------------------------

weird = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
tokens = st.one_of(weird, st.sampled_from(["counts", "db.counts", "db.words", "-", "--", "--json", "0", "-1",
                                           "1000", "99999999999999999999", "nan", "²", "a\n", "lake.db.counts"]))


@pytest.fixture(scope="module")
def fuzz_tree(zk_server, tmp_path_factory) -> tuple[str, Path]:
    """A chroot and an embedded catalog (its home returned) where job ``counts`` committed one epoch of
    ``db.counts`` from the root table ``db.words``: the commands have something real to work on."""
    connect, home = f"{zk_server.connect_string}/fuzz-cli", tmp_path_factory.mktemp("fuzz-home")
    lake = CatalogSettings.embedded(home)
    for table in ("db.words", "db.counts"):
        create_table(lake.load(), table)
    with Tidemark.connect(connect, session_timeout=4, operation_timeout=20) as tm:
        # always_run: db.words is empty, and an idle epoch would publish no snapshot to work on.
        writer = lead_job(tm, lake, "counts", ["db.counts"], sources=("db.words",), always_run=True)
        try:
            commit_rows(writer, writer.barriers.ensure_grid(1000).floor(now_ms()))
        finally:
            writer.close()
    return connect, home


def command_lines(connect: str, data_dir: str) -> st.SearchStrategy:
    """Mostly well-formed command lines with odd values, so most examples reach ZooKeeper and the catalog."""
    zk = st.one_of(st.just(connect),
                   st.sampled_from(["host:notaport", ":", "[::1", "h:99999", f"{connect}/", f"{connect}//x"]),
                   weird.map(lambda chroot: f"{connect}/{chroot}"))
    root = st.one_of(st.sampled_from(["tidemark", "/", "/a/", "/a\n", "/²", "//x", "/other"]),
                     weird.map(lambda r: "/" + r))
    name = st.one_of(st.sampled_from(["counts", "db.counts", "db.words", "lake.db.counts", "nojob", "words"]), tokens)
    number = st.one_of(st.integers(-10, 10 ** 16).map(str), st.sampled_from(["1700000002000", "2000", "nan", "1e3",
                                                                             "tidemark-1700000000000", "tidemark-x"]))
    policy = st.one_of(st.sampled_from(["hourly:48h,daily:7d", "hourly:48h", "x=1", "", "hourly:-1h", "daily:0d"]),
                       weird)

    def optional(*parts: str) -> st.SearchStrategy[list[str]]:
        return st.booleans().map(lambda on: list(parts) if on else [])

    def maybe(strategy: st.SearchStrategy[list[str]]) -> st.SearchStrategy[list[str]]:
        return st.one_of(st.just([]), strategy)

    commands = st.one_of(
        st.tuples(st.just(["status"]), optional("--json")).map(sum_lists),
        st.tuples(st.just(["topology", "--format"]), st.sampled_from(["text", "json", "dot", "mermaid", "xml"])
                  .map(lambda f: [f])).map(sum_lists),
        st.tuples(st.just(["fence"]), name.map(lambda n: [n]), maybe(weird.map(lambda by: ["--by", by]))
                  ).map(sum_lists),
        st.tuples(st.just(["unregister"]), name.map(lambda n: [n]), optional("--yes")).map(sum_lists),
        st.tuples(st.sampled_from([["pause"], ["retire"], ["resume"]]), name.map(lambda n: [n]), optional("--yes"),
                  maybe(weird.map(lambda r: ["--reason", r])), maybe(number.map(lambda d: ["--for", d]))
                  ).map(sum_lists),
        st.tuples(st.just(["barriers"]), maybe(st.tuples(number, number).map(
            lambda t: ["--set-interval", t[0], "--from", t[1]]))).map(sum_lists),
        st.tuples(st.just(["resolve"]), st.lists(name, min_size=1, max_size=3),
                  maybe(st.sampled_from(["latest", "committed", "consistent"]).map(lambda lv: ["--level", lv])),
                  maybe(number.map(lambda t: ["--as-of", t])), optional("--no-zk"), optional("--json")
                  ).map(sum_lists),
        st.tuples(st.just(["gc"]), optional("--dry-run"), optional("--json"),
                  maybe(policy.map(lambda spec: ["--policy", spec]))).map(sum_lists),
        st.tuples(st.just(["versions"]), optional("--json")).map(sum_lists),
        st.tuples(st.just(["zk"]), st.sampled_from(["status", "stop"]).map(lambda a: [a]),
                  st.sampled_from([data_dir, data_dir + "/x\n", data_dir + "/²"]).map(lambda d: ["--data-dir", d])
                  ).map(sum_lists),
        st.lists(tokens, min_size=1, max_size=3),  # anything at all
    )

    @st.composite
    def argv(draw) -> list[str]:
        # A bad --timeout is a usage error before anything else (test_errors.py): always a good one here.
        line = ["--zk", draw(zk), "--timeout", "5", *draw(maybe(root.map(lambda r: ["--root", r])))]
        return [*line, *draw(commands)]
    return argv()


def sum_lists(parts) -> list[str]:
    return [item for part in parts for item in part]


def test_cli_never_leaks(fuzz_tree, tmp_path, monkeypatch):
    connect, home = fuzz_tree
    monkeypatch.setenv("TIDEMARK_HOME", str(home))
    for name in ("TIDEMARK_CATALOG_URI", "TIDEMARK_ZK_USER", "TIDEMARK_ZK_READER_USER", "TIDEMARK_ZK_TLS"):
        monkeypatch.delenv(name, raising=False)

    @settings(derandomize=True, database=None, deadline=None, max_examples=400,
              suppress_health_check=[HealthCheck.too_slow])
    @given(argv=command_lines(connect, str(tmp_path / "zk")))
    def run(argv: list[str]) -> None:
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = main(argv)
        lines = err.getvalue().splitlines()
        outcomes.append(code)
        not_running = code == 3 and "zk" in argv and "status" in argv  # `zk status`: no server, as LSB says
        assert code in (0, 1, 2) or not_running, (argv, code, lines)
        assert len(lines) <= 1, (argv, lines)
        if code in (1, 2):
            assert lines and lines[0].startswith("tidemark: error: "), (argv, lines)
            assert "unexpected" not in lines[0], (argv, lines)  # the last-resort handler means a leak
    outcomes: list[int] = []
    run()
    # Most examples must get past argparse into the commands, or this fuzzes argparse alone.
    assert outcomes.count(0) >= 20 and outcomes.count(1) >= 100, {c: outcomes.count(c) for c in set(outcomes)}


# -- the Python API, against a real ZooKeeper and an embedded catalog ------------------------------------------

def test_python_api_never_leaks(zk_server, tmp_path):
    from coordinator import TidemarkError
    from coordinator.history.resolve import Resolver

    lake = CatalogSettings.embedded(tmp_path)
    tm = Tidemark.connect(f"{zk_server.connect_string}/fuzz-api", session_timeout=4, operation_timeout=5)
    cache = tm.tidemark_cache()
    resolver = Resolver(lake.load(), lake, tm, cache)
    any_value = st.one_of(weird, st.integers(), st.none(), st.lists(weird, max_size=2), st.booleans())
    name = st.one_of(st.sampled_from(["counts", "db.counts", "db.words", "db.more"]), weird)
    names = st.one_of(st.lists(name, max_size=3), any_value)
    epoch = st.one_of(st.integers(-5, 10 ** 16), edge_ints, any_value)
    calls = st.one_of(
        st.tuples(st.just(tm.register_job), st.tuples(name),
                  st.fixed_dictionaries({"sources": names, "sinks": names}, optional={"replace": any_value})),
        st.tuples(st.just(tm.fence_job), st.tuples(name), st.fixed_dictionaries({}, optional={"by": any_value})),
        st.tuples(st.just(tm.pause_job), st.tuples(name),
                  st.fixed_dictionaries({}, optional={"by": any_value, "reason": any_value, "until_ms": epoch})),
        st.tuples(st.just(tm.retire_job), st.tuples(name), st.fixed_dictionaries({}, optional={"reason": any_value})),
        st.tuples(st.just(tm.resume_job), st.tuples(name), st.just({})),
        st.tuples(st.just(tm.tidemarks), st.tuples(names), st.just({})),
        st.tuples(st.just(cache.get), st.tuples(names), st.just({})),
        st.tuples(st.just(tm.barriers.ensure_grid), st.tuples(st.one_of(st.just(1000), epoch)), st.just({})),
        st.tuples(st.just(tm.barriers.change_interval), st.tuples(epoch, epoch), st.just({})),
        st.tuples(st.just(resolver.resolve), st.tuples(names),
                  st.fixed_dictionaries({}, optional={"level": st.one_of(st.sampled_from(
                      ["latest", "committed", "consistent"]), any_value), "as_of": epoch})),
    )

    @settings(derandomize=True, database=None, deadline=None, max_examples=300,
              suppress_health_check=[HealthCheck.too_slow])
    @given(call=calls)
    def run(call) -> None:
        function, args, kwargs = call
        try:
            function(*args, **kwargs)
        except TidemarkError:
            pass
    try:
        run()
    finally:
        cache.close()
        tm.close()
