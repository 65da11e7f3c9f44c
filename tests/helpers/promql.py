"""Evaluating the shipped alert rules on scraped samples, as Prometheus would, for the subset of PromQL they use.

No PromQL evaluator ships as a Python package (``promql-parser``, a dev dependency, only parses), so
this module walks the real parser's tree with Prometheus' semantics: instant vectors with label
matchers; ``rate``/``increase`` over the range a ``RuleEvaluator`` has seen; ``absent``;
``max``/``min``/``sum`` with or without ``by``; arithmetic; comparisons as filters; ``and``; one-to-one
and ``on(...) group_left()`` matching. Anything else fails the assertion that names it, so a rule
using more cannot be evaluated wrongly by accident.

    rules = RuleEvaluator(yaml.safe_load(RULES.read_text()))
    for t in range(0, 3600, 30):
        rules.evaluate(t, scraped_series(body, target))   # each scrape, at Prometheus' evaluation times
    rules.fired   # {(alert, tidemark_job, tidemark_pipeline or "*"), ...}: alerts active for at least their `for`
"""
from __future__ import annotations

import operator
import re
from collections.abc import Iterable
from typing import Any, Callable, Optional, Union

from prometheus_client.parser import text_string_to_metric_families

Labels = dict[str, str]
Sample = tuple[Labels, float]
Series = dict[str, list[Sample]]   # metric name -> samples
History = list[tuple[float, Series]]  # (evaluation time in seconds, series then), oldest first
Value = Union[float, list[Sample]]

_ARITHMETIC: dict[str, Callable[[float, float], float]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
_COMPARISON: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, "<": operator.lt, ">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne}
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def scraped_series(body: str, target: Labels) -> Series:
    """The samples of one scrape, by metric name, with the target labels Prometheus adds (``instance``, ``job``)."""
    series: Series = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            series.setdefault(sample.name, []).append(({**sample.labels, **target}, float(sample.value)))
    return series


def duration_s(text: Optional[str]) -> float:
    """``"5m"`` -> 300.0; None (no ``for``) -> 0."""
    if not text:
        return 0.0
    found = re.fullmatch(r"(\d+)(ms|s|m|h|d)", text)
    assert found, f"duration {text!r} is not evaluated here"
    return int(found.group(1)) * _UNITS[found.group(2)]


def evaluate(expr: str, series: Series, history: Optional[History] = None, now: float = 0.0) -> Value:
    """An instant evaluation of ``expr`` at ``now`` over ``series``; range functions read ``history``."""
    import promql_parser

    def matches(labels: Labels, selector: Any) -> bool:
        for matcher in selector.matchers.matchers:
            value, op = labels.get(matcher.name, ""), str(matcher.op)
            if op.endswith(".Equal"):
                ok = value == matcher.value
            elif op.endswith(".NotEqual"):
                ok = value != matcher.value
            elif op.endswith(".Re"):
                ok = re.fullmatch(matcher.value, value) is not None
            elif op.endswith(".NotRe"):
                ok = re.fullmatch(matcher.value, value) is None
            else:
                raise AssertionError(f"matcher {op} is not evaluated here")
            if not ok:
                return False
        assert not selector.matchers.or_matchers, "`or` matchers are not evaluated here"
        return True

    def select(selector: Any, at: Series) -> list[Sample]:
        return [(labels, v) for labels, v in at.get(selector.name, []) if matches(labels, selector)]

    def key(labels: Labels, names: Optional[Iterable[str]]) -> tuple:
        return tuple(sorted(labels.items())) if names is None else tuple(labels.get(n) for n in names)

    def matching_labels(modifier: Any) -> Optional[list[str]]:
        matching = getattr(modifier, "matching", None) if modifier is not None else None
        if matching is None:
            return None
        assert str(matching.type).endswith("Include"), "ignoring(...) is not evaluated here"
        return list(matching.labels)

    def increase(node: Any) -> list[tuple[Labels, float, float]]:
        """``increase(v[range])``: last minus first sample seen within the range, counter resets added back, with
        the time between them (without Prometheus' extrapolation to the range's edges)."""
        window = node.range.total_seconds()
        points: dict[tuple, tuple[Labels, list[tuple[float, float]]]] = {}
        for t, at in history or []:
            if now - window <= t <= now:
                for labels, v in select(node.vector_selector, at):
                    points.setdefault(key(labels, None), (labels, []))[1].append((t, v))
        result = []
        for labels, values in points.values():
            if len(values) >= 2:
                total = sum(b - a if b >= a else b for (_, a), (_, b) in zip(values, values[1:]))
                result.append((labels, total, values[-1][0] - values[0][0]))
        return result

    def walk(node: Any) -> Value:
        if isinstance(node, promql_parser.NumberLiteral):
            return float(node.val)
        if isinstance(node, promql_parser.ParenExpr):
            return walk(node.expr)
        if isinstance(node, promql_parser.VectorSelector):
            return select(node, series)
        if isinstance(node, promql_parser.Call):
            name, args = node.func.name, node.args
            if name == "absent":
                inner = walk(args[0])
                assert isinstance(inner, list)
                return [] if inner else [({}, 1.0)]
            if name in ("rate", "increase"):
                [matrix] = args
                assert isinstance(matrix, promql_parser.MatrixSelector), name
                grown = increase(matrix)
                if name == "increase":
                    return [(lb, v) for lb, v, _ in grown]
                return [(lb, v / span) for lb, v, span in grown if span > 0]
            raise AssertionError(f"function {name} is not evaluated here")
        if isinstance(node, promql_parser.AggregateExpr):
            by = None
            if node.modifier is not None:
                assert str(node.modifier.type).endswith("By"), "without(...) is not evaluated here"
                by = list(node.modifier.labels)
            inner = walk(node.expr)
            assert isinstance(inner, list)
            groups: dict[tuple, tuple[Labels, list[float]]] = {}
            for labels, v in inner:
                kept = {n: labels[n] for n in by or () if n in labels}
                groups.setdefault(key(kept, None), (kept, []))[1].append(v)
            aggregate: dict[str, Callable[[list[float]], float]] = {"max": max, "min": min, "sum": sum}
            return [(labels, aggregate[str(node.op)](values)) for labels, values in groups.values()]
        assert isinstance(node, promql_parser.BinaryExpr), type(node)
        op, lhs, rhs = str(node.op), walk(node.lhs), walk(node.rhs)
        names = matching_labels(node.modifier)
        if op == "and":
            assert isinstance(lhs, list) and isinstance(rhs, list)
            keys = {key(labels, names) for labels, _ in rhs}
            return [(labels, v) for labels, v in lhs if key(labels, names) in keys]
        apply = _ARITHMETIC.get(op)
        if isinstance(lhs, float) and isinstance(rhs, float):
            return apply(lhs, rhs) if apply else float(_COMPARISON[op](lhs, rhs))
        pairs: list[tuple[Labels, float, float]]
        if isinstance(rhs, float):
            assert isinstance(lhs, list)
            pairs = [(labels, v, rhs) for labels, v in lhs]
        elif isinstance(lhs, float):
            pairs = [(labels, lhs, v) for labels, v in rhs]
        else:
            right: dict[tuple, float] = {}
            for labels, v in rhs:
                k = key(labels, names)
                assert k not in right, f"many-to-many matching in {op}: not valid PromQL"
                right[k] = v
            pairs = [(labels, v, right[k]) for labels, v in lhs if (k := key(labels, names)) in right]
        if apply:
            return [(labels, apply(a, b)) for labels, a, b in pairs]
        return [(labels, a if not isinstance(lhs, float) else b) for labels, a, b in pairs if _COMPARISON[op](a, b)]
    return walk(promql_parser.parse(expr))


def returned(rule: dict, series: Series, history: Optional[History] = None, now: float = 0.0) -> list[str]:
    """The ``tidemark_job`` (else the ``tidemark_pipeline``, else ``*``) of every sample the rule's expression
    returns at ``now`` (``for`` ignored)."""
    result = evaluate(rule["expr"], series, history, now)
    assert isinstance(result, list), f"{rule['alert']}: a rule must return a vector"
    return sorted(labels.get("tidemark_job") or labels.get("tidemark_pipeline", "*") for labels, _ in result)


class RuleEvaluator:
    """Every alerting rule of a rule file, evaluated at successive times as Prometheus' rule manager does: an
    alert is pending from the first evaluation that returns its sample, and fires once it has been returned at
    every evaluation for at least its ``for``; it is dropped at the first evaluation that does not return it."""

    def __init__(self, rule_file: dict) -> None:
        self.rules = [rule for group in rule_file["groups"] for rule in group["rules"] if "alert" in rule]
        self.history: History = []
        self.active: dict[tuple[str, str], float] = {}  # (alert, job) -> when it became pending
        self.fired: dict[tuple[str, str], float] = {}   # (alert, job) -> when it first fired
        self.returned: set[tuple[str, str]] = set()     # everything any evaluation returned (pending or not)

    def evaluate(self, now: float, series: Series) -> None:
        self.history.append((now, series))
        seen = set()
        for rule in self.rules:
            for job in returned(rule, series, self.history, now):
                alert = (rule["alert"], job)
                seen.add(alert)
                since = self.active.setdefault(alert, now)
                if now - since >= duration_s(rule.get("for")):
                    self.fired.setdefault(alert, now)
        self.returned |= seen
        self.active = {alert: since for alert, since in self.active.items() if alert in seen}
