"""The review a reviewer hands back: findings with a severity, a verdict and the exit status it maps to."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

EXIT_PASS, EXIT_FLAG, EXIT_REJECT, EXIT_USAGE, EXIT_CANNOT = 0, 1, 2, 3, 4
# a defect measured (reject) outranks a part that could not be read (cannot review): a block whose future leaks
# is rejected even where its token mixing reads as no known kind
SEVERITY_RANK = {"pass": 0, "info": 0, "warn": 1, "flag": 1, "cannot": 2, "reject": 3}
VERDICTS = ("pass", "flag", "cannot review", "reject")
EXIT_OF = dict(zip(VERDICTS, (EXIT_PASS, EXIT_FLAG, EXIT_CANNOT, EXIT_REJECT)))

@dataclass
class Finding:
    check: str
    severity: str  # pass | info | warn | flag | reject | cannot (no attention or no FFN to review)
    message: str
    value: object = None


@dataclass
class Review:
    subject: str
    mode: str  # "module" or "hf-config"
    role: str | None
    facts: dict = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    def add(self, check: str, severity: str, message: str, value=None) -> None:
        self.findings.append(Finding(check, severity, message, value))

    @property
    def verdict(self) -> str:
        worst = max((SEVERITY_RANK[f.severity] for f in self.findings), default=0)
        return VERDICTS[worst]

    @property
    def exit_status(self) -> int:
        return EXIT_OF[self.verdict]

    def severity_of(self, check: str) -> str | None:
        found = [f.severity for f in self.findings if f.check == check]
        return max(found, key=SEVERITY_RANK.get) if found else None

    def to_dict(self) -> dict:
        """The facts scripts read most ('structure', 'parameters') also sit at the top level."""
        top = {k: self.facts[k] for k in ("structure", "parameters") if k in self.facts}
        return {"subject": self.subject, "mode": self.mode, "role": self.role, "verdict": self.verdict,
                "exit_status": self.exit_status, **top, "facts": self.facts,
                "findings": [asdict(f) for f in self.findings]}

    def text(self) -> str:
        role = f", role {self.role}" if self.role else ""
        lines = [f"blocklab review: {self.subject} ({self.mode}{role})"]
        if self.facts.get("config_source"):
            lines.append(f"  config reviewed: {self.facts['config_source']}")
        lines += [f"  {f.severity.upper():<7}{f.check:<18}{f.message}" for f in self.findings]
        lines.append(f"verdict: {self.verdict.upper()} (exit {self.exit_status})")
        return "\n".join(lines)

