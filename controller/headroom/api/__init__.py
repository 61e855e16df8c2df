"""The two custom resources: pydantic models, CRD generation, offline validation."""
