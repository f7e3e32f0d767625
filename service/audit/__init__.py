"""The audit sample and audited estimates of the true metrics (contract: "Audit sample and
audited estimates"): which queries are audited (:mod:`service.audit.sample`), and the
prediction-powered estimates built from their audits and every query's live labels."""

from service.audit.sample import audit_hash, in_audit_sample

__all__ = ["audit_hash", "in_audit_sample"]
