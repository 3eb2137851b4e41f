"""The `mascot` command: demo, serve, query, report, chat, rate, init."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import typer

from mascot_dag.lib.storage import named_queries

app = typer.Typer(help="MASCOT-DAG: multi-agent socio-collaborative companions.",
                  no_args_is_help=True)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"mascot-dag {version('mascot-dag')}")
        raise typer.Exit()


@app.callback()
def main(_: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                help="Print the package version and exit.")) -> None:
    """MASCOT-DAG: multi-agent socio-collaborative companions."""


def _check_port(port: int, host: str = "127.0.0.1") -> None:
    from mascot_dag.lib.runtime.ports import port_problem

    if problem := port_problem(host, port):
        typer.echo(problem, err=True)
        raise typer.Exit(2)




@app.command()
def init() -> None:
    """Create MASCOT_HOME and DAGSTER_HOME (used by `make dev`)."""
    from mascot_dag.pipeline import prepare_home

    home = prepare_home()
    typer.echo(f"MASCOT_HOME={home.root}\nDAGSTER_HOME={os.environ['DAGSTER_HOME']}")


@app.command()
def demo(
    profile: str = typer.Option(
        None, help="embedded (default) | study | paper | tiny; or $MASCOT_PROFILE"),
    missing_only: bool = typer.Option(
        False, "--missing-only",
        help="Only asset partitions that are missing, failed or older than an upstream."),
    set_: list[str] = typer.Option(
        [], "--set", help="KEY=VALUE of a lineage setting over the profile's (repeatable; "
        "VALUE as JSON when it parses), e.g. --set probe_blocking=false --set eval_contexts=8"),
    sizes: str = typer.Option(
        None, help="Another profile's sizes with this profile's resources, on CPU, gates "
        "non-blocking: --profile paper --sizes tiny tries vLLM and the LLM judge on a laptop"),
    select: list[str] = typer.Option(
        [], "--select", help="Only these asset partitions (repeatable): ASSET, or "
        "ASSET:P1,P2 for some partitions, e.g. --select persona_adapters:anchor,beacon"),
    executor: str = typer.Option(
        None, help="in_process (default) | multiprocess | ray (the cluster profile's default: "
        "each step a Ray job at $MASCOT_RAY_ADDRESS); or $MASCOT_EXECUTOR"),
    personas: Path = typer.Option(None, help="Your persona sets: every *.yaml of DIR (README "
                                  "'Your own group'); or $MASCOT_PERSONAS_DIR"),
    contexts: Path = typer.Option(None, help="Your contexts: CSV, JSONL or Parquet with "
                                  "context_id, text; or $MASCOT_CONTEXTS_PATH"),
) -> None:
    """Materialise the whole lineage (asset runs in the Dagster instance) and say where it is."""
    # before the definitions load: they read the persona folder for the partitions
    if personas:
        os.environ["MASCOT_PERSONAS_DIR"] = str(personas.resolve())
    if contexts:
        os.environ["MASCOT_CONTEXTS_PATH"] = str(contexts.resolve())
    from mascot_dag.lib.runtime.quiet import quiet_libraries

    quiet_libraries()  # before transformers, datasets and mlflow are imported
    from mascot_dag.pipeline import interruptible, prepare_home

    interruptible()  # SIGINT/SIGTERM stop the walk; SIGUSR1 dumps every thread's stack
    if profile:
        os.environ["MASCOT_PROFILE"] = profile
    # Through the environment, so that steps running in other processes (multiprocess, Ray
    # workers) build the same settings and executor (profiles.settings_from_env).
    if sizes:
        os.environ["MASCOT_SIZES"] = sizes
    if set_:
        import json

        os.environ["MASCOT_SET"] = json.dumps(set_)
    if executor:
        os.environ["MASCOT_EXECUTOR"] = executor
    home = prepare_home()
    import dagster as dg

    from mascot_dag.pipeline import StepResult, parse_selection, run_lineage
    from mascot_dag.profiles import executor_name, resources_for

    try:
        executor_name()
        resources = resources_for()
        selected = None
        if select:
            from mascot_dag.pipeline import lineage_definitions

            selected = parse_selection(lineage_definitions(resources).resolve_asset_graph(),
                                       select)
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    t0 = time.monotonic()
    typer.echo(f"{'Selected asset partitions' if select else 'Whole lineage'}, profile "
               f"{os.environ.get('MASCOT_PROFILE', 'embedded')}, executor {executor_name()}: one "
               "asset run per step, recorded in the Dagster instance (make dev shows them).",
               err=True)

    def progress(r: StepResult) -> None:
        state = "ok" if r.success else f"FAILED ({', '.join(r.failed)}; run {r.run_id[:8]})"
        typer.echo(f"  {time.monotonic() - t0:6.0f} s  {r.seconds:5.0f} s  {r.step.label}  {state}",
                   err=True)
        for e in r.errors:
            typer.echo("    " + e.strip().splitlines()[-1][:600], err=True)

    with dg.DagsterInstance.get() as instance:
        try:
            results = run_lineage(resources, instance=instance, on_step=progress,
                                  missing_only=missing_only, selection=selected)
        except KeyboardInterrupt:
            typer.echo(f"\nStopped after {time.monotonic() - t0:.0f} s: the asset run in progress "
                       "is recorded as failed. `mascot demo --missing-only` goes on from there.",
                       err=True)
            raise typer.Exit(130) from None
    failed = [r for r in results if not r.success]
    typer.echo(f"\nLineage finished in {time.monotonic() - t0:.0f} s ({len(results)} runs"
               f"{f', {len(failed)} failed' if failed else ''}).")
    typer.echo(f"  DuckDB:   {home.duckdb}   (mascot query NAME, or duckdb {home.duckdb})")
    typer.echo(f"  MLflow:   {resources['tracking'].uri}   (make mlflow-ui)")
    typer.echo(f"  Reports:  {home.reports}")
    typer.echo(f"  Dagster:  {os.environ['DAGSTER_HOME']}   (make dev)")
    if failed:
        typer.echo("Re-run with `mascot demo --missing-only` to redo only what is missing.")
        raise typer.Exit(1)


@app.command()
def serve(
    model: str = typer.Option("embedded:smollm2-135m-instruct",
                              help="Base model: embedded, HF id or path."),
    adapter: list[str] = typer.Option(
        [], help="[NAME=]PEFT adapter folder or models:/<name>@<alias> URI (repeatable)."
    ),
    host: str = typer.Option("127.0.0.1", help="Bind address (loopback by default)."),
    port: int = typer.Option(8000, help="Port (0 picks a free one)."),
    served_model_name: list[str] = typer.Option(
        [], help="Name(s) the base model answers to in `model` (default: --model)."
    ),
    engine: str = typer.Option(
        "vllm", help="vllm (vLLM's async engine) or transformers (machines without vllm)."
    ),
    models: str = typer.Option(None, help="Without --adapter: champion | latest | base | an "
                               "alias (default: the champion, else the latest versions)."),
) -> None:
    """Serve an OpenAI-compatible /v1/chat/completions endpoint (FastAPI + uvicorn) over vLLM's
    async engine (or transformers), with /metrics; see mascot_dag/lib/serving/server.py."""
    from mascot_dag.lib.runtime.quiet import quiet_libraries

    quiet_libraries()  # MLflow's store set-up lines would bury a one-line error
    adapter = list(adapter)
    if not adapter:  # the trained group, each adapter under its registered model's name
        from mascot_dag.companions import served_adapters

        for spec, label in served_adapters(models):
            adapter.append(spec)
            typer.echo(f"adapter {label}", err=True)
    args = ["--model", model, "--host", host, "--port", str(port), "--engine", engine]
    for spec in adapter:
        args += ["--adapter", spec]
    for name in served_model_name:
        args += ["--served-model-name", name]
    from mascot_dag.lib.serving.server import main

    sys.exit(main(args))


def _read_db(path: Path, sql: str, params: list | dict | None = None):
    """A command's read: read-only (no DDL, beside other readers); while a run holds the file,
    one line on stderr naming it and what to do, and exit 1: no minute's wait, no traceback."""
    import duckdb

    from mascot_dag.lib.storage import db

    try:
        return db.query_pl(path, sql, params, read_only=True)
    except db.DatabaseLocked as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    except (duckdb.CatalogException, duckdb.BinderException) as e:
        # a reader no longer creates missing tables: a file from an older version says so
        first = str(e).strip().splitlines()[0]
        typer.echo(f"{path}: {first} (a file older than this version's schema? any run "
                   "brings it up to date)", err=True)
        raise typer.Exit(1) from None


@app.command(help=named_queries.describe())
def query(
    name: str = typer.Argument(..., help="A query in mascot_dag/sql/queries/NAME.sql"),
    param: list[str] = typer.Option([], "--param", "-p", help="k=v, bound as $k"),
    limit: int = typer.Option(50, help="Rows to print (0: all)."),
) -> None:
    from mascot_dag.lib.storage.home import Home

    path = named_queries.QUERIES / f"{name}.sql"
    if not path.exists():
        typer.echo(f"no query {name!r}; available: {', '.join(named_queries.names())}", err=True)
        raise typer.Exit(2)
    params = {}
    for kv in param:
        if "=" not in kv:
            typer.echo(f"--param {kv!r}: expected k=v", err=True)
            raise typer.Exit(2)
        k, v = kv.split("=", 1)
        params[k] = v
    sql = path.read_text(encoding="utf-8")
    missing = [p for p in named_queries.parameters(sql) if p not in params]
    if missing:
        typer.echo(f"query {name} needs {' '.join(f'--param {m}=VALUE' for m in missing)}",
                   err=True)
        raise typer.Exit(2)
    home = Home.from_env()
    if not home.duckdb.exists():
        typer.echo(f"{home.duckdb} does not exist yet: run `make demo` first", err=True)
        raise typer.Exit(2)
    from mascot_dag.lib.markdown import text_table

    df = _read_db(home.duckdb, sql, params or None)
    shown = df if limit <= 0 else df.head(limit)
    typer.echo(text_table(shown) if len(df) else "(no rows)")
    if len(shown) < len(df):
        typer.echo(f"(showing {len(shown)} of {len(df)} rows; --limit 0 shows all)")


@app.command()
def chat(
    turns: int = typer.Option(
        0, help="Stop after this many of your messages (0 = until EOF/quit)."),
    max_new_tokens: int = typer.Option(
        None, help="Tokens per agent reply (default: the profile's, as evaluated)."),
    agents_per_round: int = typer.Option(
        None, help="Agents answering each of your messages (default: the profile's)."),
    web: bool = typer.Option(False, "--web", help="Serve a chat page on 127.0.0.1 instead."),
    port: int = typer.Option(8010, help="--web: port of the chat page."),
    roster: str = typer.Option(None, help="Persona set of the persona folder that speaks "
                               "(default: the support roster, or a user's trained set; --web: "
                               "of a new conversation, the page can switch)."),
    models: str = typer.Option(None, help="champion | latest | base | an MLflow alias (default: "
                               "the champion, else the latest versions, labelled not promoted)."),
    seed: int = typer.Option(0, help="Seed of the conversation's sampling."),
    director_max_new_tokens: int = typer.Option(
        None, help="--web: tokens per director directive (default: the profile's)."),
    engine: str = typer.Option(None, help="Run the profile's model on vllm or transformers "
                               "(default: the profile's generation resource, as evaluated)."),
    profile: str = typer.Option(None, help="Profile whose settings and generation resource "
                                "speak (default: MASCOT_PROFILE, else embedded)."),
    allow_host: list[str] = typer.Option(None, "--allow-host", help="--web: answer this Host "
                                         "name too (NAME, NAME:PORT; or MASCOT_ALLOWED_HOSTS)."),
) -> None:
    """Talk to the companion group: the director picks who answers, with the trained adapters,
    requested exactly as the profile's evaluation requests them (mascot_dag.companions)."""
    from mascot_dag.companions import resolve_models, terminal_chat
    from mascot_dag.profiles import PROFILES
    from mascot_dag.resources.llm import ENGINES

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if engine is not None and engine not in ENGINES:
        typer.echo(f"--engine {engine!r}: expected one of {', '.join(ENGINES)}", err=True)
        raise typer.Exit(2)
    if profile is not None and profile not in PROFILES:
        typer.echo(f"--profile {profile!r}: expected one of {', '.join(PROFILES)}", err=True)
        raise typer.Exit(2)
    if web:
        from mascot_dag.companions import roster_of
        from mascot_dag.web.chat import load_group, serve
        from mascot_dag.web.guard import checked_hosts

        try:  # the page serves every set of the persona folder; checked before the model loads
            roster_of(roster)
        except ValueError as e:  # no such set, or a broken persona folder: one line
            typer.echo(str(e), err=True)
            raise typer.Exit(2) from None
        hosts = checked_hosts(allow_host)  # before the model loads
        _check_port(port)
        label = resolve_models(models, profile)
        group = load_group(label, max_new_tokens, agents_per_round, director_max_new_tokens,
                           engine, profile)
        trained = sorted(v for v in group.labels.values() if v != "base + persona prompt")
        typer.echo(f"Versions ({label}): {', '.join(trained)}; {group.director_label}"
                   if trained else "No trained versions in MLflow yet: base model with persona "
                   "prompts.")
        typer.echo(f"Chat page on http://127.0.0.1:{port}/ (Ctrl-C stops it)")
        serve(port, group, roster, hosts)
        return
    try:
        terminal_chat(sys.stdin, typer.echo, roster, models, engine, profile, turns, seed,
                      max_new_tokens_agent=max_new_tokens, agents_per_round=agents_per_round)
    except ValueError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None


@app.command()
def report() -> None:
    """The latest evaluation report's path and headline numbers."""
    from mascot_dag.lib.storage.home import Home

    latest = Home.from_env().reports / "latest.md"
    if not latest.exists():
        typer.echo(f"no report yet under {latest.parent}: run `make demo`", err=True)
        raise typer.Exit(2)
    typer.echo(str(latest))
    # the verdict section, then the overall table with its header (the report's first two)
    sections = latest.read_text(encoding="utf-8").split("\n## ")
    for section in sections[1:3]:
        typer.echo("\n## " + section.strip())


@app.command()
def rate(
    port: int = typer.Option(8020, help="Port of the rating page (bound to 127.0.0.1)."),
    export: Path = typer.Option(None, "--export", help="Write all ratings to FILE.csv or "
                                "FILE.parquet and exit instead of serving."),
    allow_host: list[str] = typer.Option(None, "--allow-host", help="Answer this Host name "
                                         "too (NAME, NAME:PORT; or MASCOT_ALLOWED_HOSTS)."),
) -> None:
    """Blind human evaluation: rate three-way items (MASCOT + two methods, shuffled) in a browser;
    ratings go to the DuckDB tables human_ratings and human_choices."""
    from mascot_dag.lib.storage.db import DatabaseLocked
    from mascot_dag.lib.storage.home import Home
    from mascot_dag.web import rate as web
    from mascot_dag.web.guard import checked_hosts

    path = Home.from_env().duckdb
    if export is not None:
        if not path.exists():
            typer.echo(f"no database at {path}: nothing to export", err=True)
            raise typer.Exit(2)
        try:
            n = web.export(path, export)
        except (ValueError, DatabaseLocked) as e:
            typer.echo(str(e), err=True)
            raise typer.Exit(2) from e
        typer.echo(f"{n} ratings -> {export}")
        return
    hosts = checked_hosts(allow_host)
    _check_port(port)
    typer.echo(f"Rating page on http://127.0.0.1:{port}/ (database {path}; Ctrl-C stops it)")
    web.serve(path, port, allowed_hosts=hosts)


@app.command()
def probe(arm: str = typer.Option("adapter", help="adapter | warm_start")) -> None:
    """The persona probe under its panel of readers: per reader and format the pooled paired gain
    (arm - base, context-clustered 95% CI), n, the reader's accuracy on held-out reference
    utterances and each persona's gain; the readers' agreement (Cohen's kappa); the verdict."""
    from mascot_dag.lib.evaluation.stats import MIN_CLUSTERS_FOR_SIGNIFICANCE
    from mascot_dag.lib.stage1.panel import panel_text, roster_panel, unreadable_sets
    from mascot_dag.lib.storage.home import Home

    path = Home.from_env().duckdb
    if not path.exists():
        typer.echo(f"no database at {path}: run `make demo`", err=True)
        raise typer.Exit(2)
    sets = _read_db(path, "SELECT DISTINCT c.persona_set, p.persona_id FROM persona_probe p "
                    "JOIN personas c USING (persona_id) ORDER BY 1, 2")
    stored = _read_db(path, "SELECT DISTINCT persona_set FROM personas ORDER BY 1")
    for line in unreadable_sets(stored["persona_set"].to_list(), sets["persona_set"].to_list()):
        typer.echo(line)
    if sets.is_empty():
        typer.echo("no persona_probe rows: materialise persona_adapters", err=True)
        raise typer.Exit(2)
    for (persona_set,), part in sets.group_by(["persona_set"], maintain_order=True):
        try:
            result = roster_panel(lambda sql, params: _read_db(path, sql, params),
                                  part["persona_id"].to_list(), persona_set,
                                  MIN_CLUSTERS_FOR_SIGNIFICANCE, arm=arm)
        except ValueError as e:
            typer.echo(str(e), err=True)
            raise typer.Exit(2) from None
        typer.echo(panel_text(result, arm, persona_set))


if __name__ == "__main__":
    app()
