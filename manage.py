#!/usr/bin/env python
"""Django's command-line utility for Gantry.

In a development checkout (one where ``python3 dev.py run`` ran) it reaches the
embedded databases with nothing set; ``python3 dev.py manage ARGS`` does the
same anywhere ``dev.py run`` works. A configuration error (no DATABASE_URL
outside the development path, a malformed variable) is one line on stderr and
exit status 2, before any command runs.
"""

import os
import sys

# Nothing ran: the same status as a command-line usage error.
EXIT_CONFIGURATION = 2


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gantry.settings")
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        # Loads the settings, which check every variable (gantry/conf.py). Django
        # itself would print a traceback for most commands, and a bare note under
        # `help`; the message already says what to set.
        settings.INSTALLED_APPS  # noqa: B018 - evaluated for its side effect
    except ImproperlyConfigured as exc:
        print(f"ImproperlyConfigured: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIGURATION)
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
