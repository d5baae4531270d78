"""Fit the semantic judge's model: ``autopersona_flows/weights/judge.json``.

Usage (in an environment with the package and scikit-learn; see ``training/README.md``)::

    python training/fit_judge.py [--report]

The rows are (requirement, candidate memory) pairs, featurised exactly as the
product does (`SemanticJudge.features`):

- the answerhood groups of ``training/data/groups-*.jsonl`` that the encoder was
  not trained on (``train_encoder.held_out``: its vectors of the others are
  overconfident), once per name of its requirement (its own and its ``names``),
  with the group's memories as candidates; a memory labelled ``answers`` or
  ``stale`` answers (which one is current is the policy's to tell, by time), every
  other label does not;
- the candidates the agent recalls for the judgement cases of
  ``training/data/cases-*.jsonl`` and ``tests/data/judgement/cases.jsonl`` (the dev
  set), labelled by whether the memory holds the value the case expects.

The held-out sets (``tests/data/judgement/holdout.jsonl``, ``unseen.jsonl``) are
never read. A logistic regression is fitted with its regularisation chosen by
cross-validation grouped by group or case (so paraphrases of one requirement never
sit on both sides), and the situation threshold on ``training/data/situations.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from groups import Group, read_groups
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import GroupKFold
from train_encoder import held_out

from autopersona_flows.agent.agent import PersonaAgent
from autopersona_flows.agent.decisions import PersonaRequest
from autopersona_flows.agent.evaluation import JudgementCase, read_judgement_cases
from autopersona_flows.agent.evaluation.judgement import _request, _seed
from autopersona_flows.agent.evidence import EvidencePolicy, _candidates
from autopersona_flows.agent.semantic import FEATURES, AnswerhoodModel, SemanticJudge
from autopersona_flows.memory.embedders import Embedder
from autopersona_flows.memory.encoders import WEIGHTS, SentenceEncoder, shared_encoder
from autopersona_flows.memory.jsonl import JsonlMemoryStore
from autopersona_flows.memory.records import Embedding, MemoryRecord, PersonaMemory
from autopersona_flows.memory.retrieval import MemoryRetriever, ScoredMemory, SearchRequest
from autopersona_flows.memory.text import memory_text

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "training" / "data"
DEV_CASES = ROOT / "tests" / "data" / "judgement" / "cases.jsonl"
POSITIVE = frozenset({"answers", "stale"})
SLOT = frozenset({"answers", "stale", "other_situation", "ceased", "learned", "case:answers"})


class Rows:
    """Feature rows with their labels, groups and kinds."""

    def __init__(self) -> None:
        self.x: list[np.ndarray] = []
        self.y: list[int] = []
        self.group: list[str] = []
        self.kind: list[str] = []

    def add(self, x: np.ndarray, y: list[int], group: str, kinds: list[str]) -> None:
        self.x.append(x)
        self.y += y
        self.group += [group] * len(y)
        self.kind += kinds

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return (
            np.concatenate(self.x),
            np.asarray(self.y),
            np.asarray(self.group),
            np.asarray(self.kind),
        )


def group_rows(groups: list[Group], judge: SemanticJudge, rows: Rows) -> None:
    encoder = judge.encoder
    for group in groups:
        records = [
            MemoryRecord.model_validate(
                {"layer": memory.layer, "content": memory.content, "created_at": memory.at}
            )
            for memory in group.memories
        ]
        vectors = encoder.embed([memory_text(record.content) for record in records])
        records = [
            record.model_copy(update={"embedding": Embedding.of(encoder.name, vector)})
            for record, vector in zip(records, vectors, strict=True)
        ]
        labels = [memory.label for memory in group.memories]
        for name in dict.fromkeys([group.requirement.name, *group.names]):
            requirement = group.requirement.model_copy(update={"name": name})
            request = PersonaRequest(
                user_id="someone", query=group.query, node=group.node, requirements=[requirement]
            )
            candidates = [
                ScoredMemory(
                    record=record,
                    score=0.0,
                    search=SearchRequest(layer=record.layer, query=name, label=None),
                )
                for record in records
            ]
            x, places, _ = judge.features(request, {name: candidates})
            rows.add(
                x,
                [int(labels[i] in POSITIVE) for _, i in places],
                group.id,
                [labels[i] for _, i in places],
            )


def case_rows(cases: list[JudgementCase], judge: SemanticJudge, rows: Rows) -> None:
    """Rows of the candidates the agent recalls for each case, labelled by value."""
    encoder = judge.encoder
    with tempfile.TemporaryDirectory() as folder:
        store = JsonlMemoryStore(folder)
        for case in cases:
            _seed(store, case, encoder)
        agent = PersonaAgent(MemoryRetriever(store, encoder), EvidencePolicy(judge=judge))
        for case in cases:
            request = _request(case, case.request)
            with agent.retriever.reading():
                bundle = agent._retrieve(request, agent.top_k, agent.min_similarity)
            for requirement in request.requirements:
                candidates = _candidates(requirement, bundle)
                if not candidates:
                    continue
                x, places, _ = judge.features(request, {requirement.name: candidates})
                labels = [_label(case, requirement.name, candidates[i].record) for _, i in places]
                keep = [i for i, label in enumerate(labels) if label is not None]
                if keep:
                    rows.add(
                        x[keep],
                        [int(labels[i] == "answers") for i in keep],
                        case.name,
                        [f"case:{labels[i]}" for i in keep],
                    )
            if case.learn is not None:
                learn_rows(agent, case, judge, rows)


def learn_rows(agent: PersonaAgent, case: JudgementCase, judge: SemanticJudge, rows: Rows) -> None:
    """Rows of a learn loop's follow-ups: the learned answer answers, nothing else does."""
    assert case.learn is not None
    request = _request(case, case.request)
    question = agent.decide(request)
    if question.action != "clarify":
        return
    agent.learn(request.user_id, question, case.learn.answer)
    for follow_up in case.learn.then:
        later = _request(case, follow_up.request)
        with agent.retriever.reading():
            bundle = agent._retrieve(later, agent.top_k, agent.min_similarity)
        for requirement in later.requirements:
            candidates = _candidates(requirement, bundle)
            if not candidates:
                continue
            x, places, _ = judge.features(later, {requirement.name: candidates})
            labels = [
                int(
                    isinstance(candidates[i].record.content, PersonaMemory)
                    and candidates[i].record.content.preference == case.learn.answer.strip()
                )
                for _, i in places
            ]
            rows.add(x, labels, case.name, ["learned" if y else "case:none" for y in labels])


def _label(case: JudgementCase, name: str, record: MemoryRecord) -> str | None:
    text = memory_text(record.content).casefold()
    expect = case.expect
    if expect.action == "clarify":
        return "none"
    stale = [s.casefold() for s in expect.stale.get(name, [])]
    if any(s in text for s in stale):
        return None  # on topic but superseded: the policy's call, not the pair's
    value = expect.values.get(name)
    if value is None:
        return None
    return "answers" if value.casefold() in text else "none"


def situation_threshold(encoder: Embedder) -> tuple[float, dict[str, float]]:
    """The cosine from which a stated situation counts as a request's, fitted on data."""
    path = DATA / "situations.jsonl"
    if not path.exists():
        return 0.35, {}
    scores: list[float] = []
    truth: list[int] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        if not held_out(item["id"]):
            continue  # the encoder learned these
        situations = item["situations"]
        # Requests as the judge reads them for their situation: their queries.
        r = encoder.embed([x["query"] for x in item["requests"]])
        s = encoder.embed(situations)
        sims = r @ s.T
        for request, row in zip(item["requests"], sims, strict=True):
            for situation, sim in zip(situations, row, strict=True):
                scores.append(float(sim))
                truth.append(int(request["in"] == situation))
    scores_a, truth_a = np.asarray(scores), np.asarray(truth)
    best = max(np.arange(0.1, 0.8, 0.01), key=lambda t: ((scores_a >= t) == truth_a).mean())
    accuracy = float(((scores_a >= best) == truth_a).mean())
    return float(best), {
        "situation_accuracy": accuracy,
        "situation_auc": float(roc_auc_score(truth_a, scores_a)),
    }


def fit(x: np.ndarray, y: np.ndarray, groups: np.ndarray) -> tuple[LogisticRegression, dict]:
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale == 0] = 1.0
    z = (x - mean) / scale
    best: tuple[float, float] | None = None
    folds = GroupKFold(n_splits=5)
    for c in (0.01, 0.03, 0.1, 0.3, 1.0, 3.0):
        predicted = np.zeros(len(y))
        for train, test in folds.split(z, y, groups):
            model = LogisticRegression(C=c, max_iter=2000).fit(z[train], y[train])
            predicted[test] = model.predict_proba(z[test])[:, 1]
        auc = roc_auc_score(y, predicted)
        if best is None or auc > best[1]:
            best = (c, auc)
    assert best is not None
    model = LogisticRegression(C=best[0], max_iter=2000).fit(z, y)
    model.mean_, model.scale_ = mean, scale  # type: ignore[attr-defined]
    return model, {"C": best[0], "cv_auc": best[1]}


def groups_files() -> Iterator[Path]:
    yield from sorted(DATA.glob("groups-*.jsonl"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=WEIGHTS / "judge.json")
    parser.add_argument("--report", action="store_true", help="print weights by feature")
    parser.add_argument("--encoder", type=Path, help="an encoder folder (default: shipped)")
    parser.add_argument(
        "--all-groups", action="store_true", help="fit on every group, not only the held-out ones"
    )
    args = parser.parse_args()
    encoder = SentenceEncoder(args.encoder) if args.encoder else shared_encoder()
    threshold, situation_meta = situation_threshold(encoder)
    # Features are computed with the model's situation threshold: fit that first.
    placeholder = args.out.with_suffix(".fitting.json")
    placeholder.write_text(
        json.dumps(
            {
                "features": FEATURES,
                "mean": [0.0] * len(FEATURES),
                "scale": [1.0] * len(FEATURES),
                "coef": [0.0] * len(FEATURES),
                "intercept": 0.0,
                "slot_coef": [0.0] * len(FEATURES),
                "slot_intercept": 0.0,
                "situation": threshold,
            }
        )
    )
    judge = SemanticJudge(encoder, AnswerhoodModel(placeholder))
    rows = Rows()
    groups = [
        group
        for path in groups_files()
        for group in read_groups(path)
        if args.all_groups or held_out(group.id)
    ]
    group_rows(groups, judge, rows)
    cases = read_judgement_cases(DEV_CASES)
    for path in sorted(DATA.glob("cases-*.jsonl")):
        cases += read_judgement_cases(path)
    case_rows(cases, judge, rows)
    placeholder.unlink()
    x, y, group_ids, kinds = rows.arrays()
    model, meta = fit(x, y, group_ids)
    slot = np.isin(kinds, sorted(SLOT)).astype(int)
    slot_model, slot_meta = fit(x, slot, group_ids)
    meta |= {f"slot_{key}": value for key, value in slot_meta.items()}
    meta |= situation_meta | {
        "rows": len(y),
        "positives": int(y.sum()),
        "groups": len(groups),
        "cases": len(cases),
        "encoder": encoder.name,
        "fitted": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    args.out.write_text(
        json.dumps(
            {
                "features": FEATURES,
                "mean": model.mean_.tolist(),  # type: ignore[attr-defined]
                "scale": model.scale_.tolist(),  # type: ignore[attr-defined]
                "coef": model.coef_[0].tolist(),
                "intercept": float(model.intercept_[0]),
                "slot_coef": (slot_model.coef_[0] / 1.0).tolist(),
                "slot_intercept": float(slot_model.intercept_[0]),
                "situation": threshold,
                "meta": meta,
            },
            indent=1,
        )
        + "\n"
    )
    print(json.dumps(meta, indent=1))
    if args.report:
        for name, weight in sorted(
            zip(FEATURES, model.coef_[0], strict=True), key=lambda pair: -abs(pair[1])
        ):
            print(f"{name:24} {weight:+.3f}")
        for kind in sorted(set(kinds)):
            mask = kinds == kind
            print(f"{kind:24} {mask.sum():6d} rows, positive {y[mask].mean():.2f}")


if __name__ == "__main__":
    sys.exit(main())
