"""The JSON an official SDK sends for a value: its models dumped as it dumps them."""


def plain(value):
    """`value` with every SDK model replaced by model_dump(exclude_unset=True)."""
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if hasattr(value, "model_dump"):
        return value.model_dump(exclude_unset=True, mode="json")
    return value
