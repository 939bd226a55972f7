"""`moetune validate`: check a mappings file against the schema."""

from __future__ import annotations

import os

import click

from moetune.errors import InvalidMappingsError


@click.command()
@click.argument("file", required=False, type=click.Path(dir_okay=False))
def validate(file: str | None) -> None:
    """Check a moe_mappings.yaml file: YAML syntax, schema, paths.

    Without FILE, checks the built-in registry and $MOETUNE_MAPPINGS if set.
    Prints each problem on its own line (file, line, entry, field) and exits 1
    if there is any.

    \b
    Examples:
        moetune validate my_mappings.yaml
        moetune validate
    """
    from moetune.extract.mappings import ENV_VAR, builtin_mappings_path, validate_file

    if file is not None:
        paths = [file]
    else:
        paths = [str(builtin_mappings_path())]
        if os.environ.get(ENV_VAR):
            paths.append(os.environ[ENV_VAR])
    problems = {path: validate_file(path) for path in paths}
    for path, found in problems.items():
        if not found:
            click.echo(f"{path}: valid")
        for problem in found:
            click.echo(problem, err=True)
    total = sum(len(found) for found in problems.values())
    if total:
        bad = ", ".join(path for path, found in problems.items() if found)
        raise InvalidMappingsError(f"{bad}: {total} problem{'s' if total > 1 else ''}")
