"""Fine-tune the sentence encoder on our answerhood and situation data.

Usage: ``python training/train_encoder.py [--epochs 3]`` (see ``training/README.md``).
Writes ``training/checkpoints/encoder.pt`` (the torch weights; ``export_encoder.py``
turns them into the shipped int8 ONNX file) and prints held-out figures per epoch.

Three tasks share one encoder, batch by batch:

- **answerhood**: a requirement ("seat preference. options: aisle, window") against
  the memories of its group: those giving a value of it close (``answers``,
  ``stale``, ``other_situation``: which is current and which holds in the
  request's situation, the judge tells from time and situations), every other
  memory of the batch far (near misses, related and unrelated memories, at once);
- **situations**: a request against the situations a person named ("work trips"):
  close to the one it is in, far from the others;
- **contexts**: two requests in the same situation close, in different ones far:
  an answer learned for one request holds for requests like it.

Each task is a binary cross-entropy on ``scale * cosine + bias`` over every pair of
the batch. 15% of the groups and of the situation lines (by a hash of their id) are
held out of training and measured after each epoch; ``fit_judge.py`` fits the
judge's model on those held-out groups, whose vectors the encoder never learned.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from bert import SentenceEncoder, load_minilm
from export_encoder import minilm_folder
from groups import Group, read_groups
from sklearn.metrics import roc_auc_score
from tokenizers import Tokenizer
from torch import nn

from autopersona_flows.agent.planners import requirement_text
from autopersona_flows.memory.records import MemoryRecord
from autopersona_flows.memory.text import memory_text

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data"
# About the requirement's slot, with a value: whether it is the current one, and for
# the request's situation, the judge tells from time and the situation's words.
POSITIVE = frozenset({"answers", "stale", "other_situation"})


def held_out(key: str) -> bool:
    """Whether an item (by its id) is held out of the encoder's training: 15%."""
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % 100 < 15


@dataclass
class Answerhood:
    group: str
    requirement: str
    memories: list[str]
    positive: list[bool]


@dataclass
class Situated:
    line: str
    query: str
    step: str
    situations: list[str]
    inside: str | None


def answerhood(groups: list[Group]) -> list[Answerhood]:
    items = []
    for group in groups:
        memories = [
            memory_text(
                MemoryRecord.model_validate({"layer": m.layer, "content": m.content}).content
            )
            for m in group.memories
        ]
        positive = [m.label in POSITIVE for m in group.memories]
        for name in dict.fromkeys([group.requirement.name, *group.names]):
            requirement = group.requirement.model_copy(update={"name": name})
            items.append(Answerhood(group.id, requirement_text(requirement), memories, positive))
    return items


def situated(path: Path) -> list[Situated]:
    items = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        for request in item["requests"]:
            items.append(
                Situated(
                    item["id"], request["query"], request["step"], item["situations"], request["in"]
                )
            )
    return items


class Batcher:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def __call__(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        encodings = self.tokenizer.encode_batch(texts)
        width = max(len(e.ids) for e in encodings)
        ids = torch.zeros((len(texts), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, e in enumerate(encodings):
            ids[i, : len(e.ids)] = torch.tensor(e.ids)
            mask[i, : len(e.ids)] = 1
        return ids, mask


class Trainer:
    def __init__(self, model: SentenceEncoder, batch: Batcher, lr: float) -> None:
        self.model = model
        self.batch = batch
        self.scale = nn.Parameter(torch.tensor(20.0))
        self.bias = nn.Parameter(torch.tensor(-8.0))
        self.optimizer = torch.optim.AdamW(
            [
                {"params": model.parameters(), "lr": lr},
                {"params": [self.scale, self.bias], "lr": 1e-3},
            ],
            weight_decay=0.01,
        )

    def encode(self, texts: list[str]) -> torch.Tensor:
        return self.model(*self.batch(texts))

    def work(self, items: list[Situated]) -> torch.Tensor:
        """Requests as the judge reads them for their situation: their query's vectors.

        The situation lives in the query ("for the sales kickoff"); the step is the
        same for every request of a node.
        """
        return self.encode([item.query for item in items])

    def loss(self, left: torch.Tensor, right: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.scale * (left @ right.T) + self.bias
        weight = torch.where(labels > 0, 3.0, 1.0)  # positives are few in each batch
        return nn.functional.binary_cross_entropy_with_logits(logits, labels, weight=weight)

    def step(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()

    def answerhood(self, chunk: list[Answerhood]) -> torch.Tensor:
        memories = [
            (text, item.group, positive)
            for item in chunk
            for text, positive in zip(item.memories, item.positive, strict=True)
        ]
        left = self.encode([item.requirement for item in chunk])
        right = self.encode([text for text, _, _ in memories])
        labels = torch.tensor(
            [[float(p and g == item.group) for _, g, p in memories] for item in chunk]
        )
        return self.loss(left, right, labels)

    def situations(self, chunk: list[Situated]) -> torch.Tensor:
        """Requests against their person's situations, and against each other.

        Only pairs of one person count: another person's "work trips" may well be
        this one's too.
        """
        phrases = sorted({(item.line, s) for item in chunk for s in item.situations})
        left = self.work(chunk)
        right = self.encode([s for _, s in phrases])
        labels = torch.tensor([[float(item.inside == s) for _, s in phrases] for item in chunk])
        mine = torch.tensor([[item.line == line for line, _ in phrases] for item in chunk])
        logits = self.scale * (left @ right.T) + self.bias
        situations = nn.functional.binary_cross_entropy_with_logits(
            logits[mine], labels[mine], weight=torch.where(labels[mine] > 0, 3.0, 1.0)
        )
        same = torch.tensor(
            [[float(a.inside is not None and a.inside == b.inside) for b in chunk] for a in chunk]
        )
        known = torch.tensor(
            [
                [
                    a is not b and a.line == b.line and (a.inside, b.inside) != (None, None)
                    for b in chunk
                ]
                for a in chunk
            ]
        )
        logits = self.scale * (left @ left.T) + self.bias
        contexts = nn.functional.binary_cross_entropy_with_logits(
            logits[known], same[known], weight=torch.where(same[known] > 0, 3.0, 1.0)
        )
        return situations + contexts


def evaluate(trainer: Trainer, answers: list[Answerhood], situations: list[Situated]) -> dict:
    model = trainer.model.eval()
    out: dict[str, float] = {}
    with torch.no_grad():
        labels, scores, right = [], [], 0
        for item in answers:
            r = trainer.encode([item.requirement])[0]
            m = trainer.encode(item.memories)
            cos = (m @ r).numpy()
            labels += item.positive
            scores += cos.tolist()
            best = int(np.argmax(cos))
            right += item.positive[best] if any(item.positive) else 0
        out["answer_auc"] = roc_auc_score(labels, scores)
        answerable = sum(any(item.positive) for item in answers)
        out["answer_top1"] = right / max(1, answerable)
        hits = total = 0
        labels, scores = [], []
        for item in situations:
            v = trainer.work([item])[0]
            s = trainer.encode(item.situations)
            cos = (s @ v).numpy()
            labels += [item.inside == x for x in item.situations]
            scores += cos.tolist()
            if item.inside is not None:
                total += 1
                hits += item.situations[int(np.argmax(cos))] == item.inside
        out["situation_auc"] = roc_auc_score(labels, scores)
        out["situation_top1"] = hits / max(1, total)
    model.train()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--out", type=Path, default=ROOT / "checkpoints" / "encoder.pt")
    parser.add_argument("--situation-weight", type=float, default=0.5)
    args = parser.parse_args()
    torch.manual_seed(0)
    random.seed(0)
    torch.set_num_threads(2)
    folder = minilm_folder()
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(128)
    groups = [group for path in sorted(DATA.glob("groups-*.jsonl")) for group in read_groups(path)]
    train_groups = [g for g in groups if not held_out(g.id)]
    test_groups = [g for g in groups if held_out(g.id)]
    lines = situated(DATA / "situations.jsonl")
    train_sit = [s for s in lines if not held_out(s.line)]
    test_sit = [s for s in lines if held_out(s.line)]
    train_ans, test_ans = answerhood(train_groups), answerhood(test_groups)
    print(
        f"answerhood {len(train_ans)} / {len(test_ans)} held out; "
        f"situations {len(train_sit)} / {len(test_sit)}"
    )
    trainer = Trainer(load_minilm(folder), Batcher(tokenizer), args.lr)
    print("before", evaluate(trainer, test_ans, test_sit), flush=True)
    # Situation items are batched by their line, so each batch holds one person's
    # contrasting situations.
    by_line: dict[str, list[Situated]] = {}
    for item in train_sit:
        by_line.setdefault(item.line, []).append(item)
    for epoch in range(args.epochs):
        started = time.time()
        random.shuffle(train_ans)
        persons = list(by_line.values())
        random.shuffle(persons)
        chunks_a = [train_ans[i : i + args.batch] for i in range(0, len(train_ans), args.batch)]
        chunks_s = [
            [item for person in persons[i : i + 2] for item in person]
            for i in range(0, len(persons), 2)
        ]
        steps = max(len(chunks_a), len(chunks_s))
        for step in range(steps):
            loss = torch.zeros(())
            if step < len(chunks_a):
                loss = loss + trainer.answerhood(chunks_a[step])
            if step < len(chunks_s) and args.situation_weight:
                loss = loss + args.situation_weight * trainer.situations(chunks_s[step])
            trainer.step(loss)
        figures = evaluate(trainer, test_ans, test_sit)
        print(f"epoch {epoch} ({time.time() - started:.0f} s)", figures, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(trainer.model.state_dict(), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
