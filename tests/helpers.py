"""Helpers shared by tests: tiny corpora and JSONL writers."""

from __future__ import annotations

import json
from pathlib import Path

TINY_ROWS = [
    ("p1", "Iron deficiency anemia", "Microcytic hypochromic anemia with low ferritin and high total iron-binding capacity."),
    ("p2", "Vitamin B12 deficiency", "Macrocytic anemia with hypersegmented neutrophils and subacute combined degeneration of the cord."),
    ("p3", "Digoxin toxicity", "Nausea, yellow-green vision and atrial tachycardia with block; worsened by hypokalemia."),
    ("p4", "Graves disease", "Hyperthyroidism with diffuse goiter, exophthalmos and pretibial myxedema from TSH receptor antibodies."),
    ("p5", "Hashimoto thyroiditis", "Hypothyroidism with anti-thyroid peroxidase antibodies and lymphocytic infiltrate with germinal centers."),
    ("p6", "Streptococcus pneumoniae", "Lancet-shaped gram-positive diplococci; the most common cause of community-acquired pneumonia."),
    ("p7", "Myasthenia gravis", "Fatigable ptosis and diplopia from antibodies against the acetylcholine receptor; improves with edrophonium."),
    ("p8", "Lambert-Eaton syndrome", "Proximal weakness improving with repeated use; antibodies to presynaptic calcium channels; small cell carcinoma."),
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    return path


def snippet(pid: str, title: str, content: str) -> dict:
    return {"id": pid, "title": title, "content": content, "contents": f"{title}. {content}"}
