"""`mentor setup-sandbox`: install bubblewrap where possible and report the code sandbox's layers."""

from __future__ import annotations

import os
import shutil
import subprocess

import click

from mentor.pipeline.errors import MentorError

APT_PACKAGE = "bubblewrap"


def install_commands() -> list[list[str]] | None:
    """The apt commands that install bubblewrap here (tried in turn); None when there is no way to."""
    if shutil.which("bwrap"):
        return []
    if not shutil.which("apt-get"):
        return None
    if os.geteuid() == 0:
        prefix: list[str] = []
    elif shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        prefix = ["sudo", "-n"]  # never prompts: a laptop without passwordless sudo gets the manual step instead
    else:
        return None
    install = [*prefix, "apt-get", "install", "-y", "--no-install-recommends", APT_PACKAGE]
    return [install, [*prefix, "apt-get", "update"], install]  # a fresh machine may need the package lists first


@click.command("setup-sandbox")
@click.option("--no-install", is_flag=True, help="Only report; do not try to install bubblewrap.")
@click.option("--strict", is_flag=True, help="Exit 1 when a sandbox layer is missing (as MENTOR_SANDBOX_STRICT=1 would refuse).")
def setup_sandbox(no_install, strict):
    """Install bubblewrap (apt, as root or with passwordless sudo) and print the layers code rewards run under.

    Prints each layer in force (the syscall filter, the memory cgroup and which
    cgroup it lives under, the /tmp caps...) and, for each missing one, why this
    host cannot have it. Without bubblewrap the code verifier falls back to
    weaker layers and warns; see docs/sandbox.md.
    """
    cmds = [] if no_install else install_commands()
    if cmds is None:
        click.echo(f"bubblewrap: not installed, and no apt-get with root or passwordless sudo here; install the "
                   f"'{APT_PACKAGE}' package with your package manager (Debian/Ubuntu: sudo apt-get install {APT_PACKAGE})", err=True)
    else:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for i, cmd in enumerate(cmds):
            if shutil.which("bwrap"):
                break
            click.echo("$ " + " ".join(cmd), err=True)
            rc = subprocess.call(cmd, env=env)
            if rc != 0 and i == len(cmds) - 1:
                click.echo(f"bubblewrap: `{' '.join(cmd)}` failed (exit {rc}); the code verifier will use its fallback layers", err=True)
    from mentor.training import sandbox

    try:
        be = sandbox.backend()
    except sandbox.SandboxUnavailable as exc:
        raise MentorError(str(exc)) from exc
    missing = [layer for layer in sandbox.REQUIRED_LAYERS if layer not in be.layers]
    if "memcg" in missing:
        missing += [layer for layer in sandbox.MEMCG_FALLBACK if layer not in be.layers]
    click.echo(f"sandbox backend: {be.name}; layers: {', '.join(be.layers)}")
    if be.memcg is not None:
        click.echo(f"memory cgroup: {be.memcg.version} under {be.memcg.base}")
    for layer in missing:
        why = be.why_missing.get(layer)
        click.echo(f"missing layer {layer}: {sandbox.LAYER_MEANING[layer]}" + (f" ({why})" if why else ""), err=True)
    if missing:
        click.echo(f"missing layers: {', '.join(missing)} (see docs/sandbox.md; MENTOR_SANDBOX_STRICT=1 refuses to run "
                   "code checks without them)", err=True)
        if strict:
            raise MentorError(f"sandbox layers missing: {', '.join(missing)}; see docs/sandbox.md (bubblewrap, memory cgroup)")
