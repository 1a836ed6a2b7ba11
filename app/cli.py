"""The servecast command line: the commands, assembled. Each lives in its own module (app/*_command.py);
what they share is in app/common.py."""

from __future__ import annotations

import sys

import typer

from app.ablate_command import ablate_command
from app.calibrate_command import calibrate_command, import_vidur_command
from app.catalog_command import catalog_command
from app.compare_command import compare_command
from app.dashboard_command import app_command
from app.generate_command import generate_command
from app.plan_command import plan_command
from app.predict_command import predict_command
from app.profile_command import profile_command
from app.replay_command import replay_command
from app.serve_command import serve_command
from app.simulate_command import simulate_command
from app.spec_pair_command import acceptance_command, train_pair_command
from app.validate_command import validate_command

def _quiet_type_column() -> None:
    """--help without Typer's <str> / <bool> type labels, which say nothing a flag's name and help do
    not (numbers and paths keep theirs). Typer >= 0.29 draws that column from its parameters."""
    from typer import core

    for name in ("TyperOption", "TyperArgument"):
        parameter = getattr(core, name, None)
        shown = getattr(parameter, "display_type_rich", None)
        if shown is None or getattr(shown, "quiet", False):
            continue

        def display_type_rich(self, ctx, shown=shown):
            label = shown(self, ctx)
            return None if getattr(self, "is_flag", False) or label in ("<str>", "<bool>") else label
        display_type_rich.quiet = True
        parameter.display_type_rich = display_type_rich


_quiet_type_column()
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="servecast: LLM-inference capacity planning on a real engine and a calibrated simulator.")


@app.callback()
def root() -> None:
    """servecast: LLM-inference capacity planning on a real engine and a calibrated simulator."""


# Registered in the order `servecast --help` lists them.
app.command("generate")(generate_command)
app.command("serve")(serve_command)
app.command("profile")(profile_command)
app.command("predict")(predict_command)
app.command("calibrate")(calibrate_command)
app.command("import-vidur")(import_vidur_command)
app.command("app")(app_command)
app.command("simulate")(simulate_command)
app.command("plan")(plan_command)
app.command("catalog")(catalog_command)
app.command("validate")(validate_command)
app.command("replay")(replay_command)
app.command("compare")(compare_command)
app.command("ablate")(ablate_command)
app.command("train-pair")(train_pair_command)
app.command("acceptance")(acceptance_command)


def main() -> None:
    try:
        code = app(standalone_mode=False)
    except typer.TyperException as exc:  # the command line itself is malformed (Typer's parser)
        if type(exc).__name__ == "NoArgsIsHelpError" or not hasattr(exc, "format_message"):
            exc.show()  # `servecast` alone: the help it asked for
        else:  # a bad option: one line, exit 2, as every other bad input
            named = {c.name for c in app.registered_commands}
            command = " ".join(a for a in sys.argv[1:2] if a in named)
            typer.echo(f"error: {exc.format_message()} (`servecast {command + ' ' if command else ''}--help` "
                       "lists the options)", err=True)
        sys.exit(getattr(exc, "exit_code", 2))
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("interrupted", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
