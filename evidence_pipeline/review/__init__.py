"""``tht evidence review``: one static HTML page for the pending change of a workspace.

:mod:`.build` gathers what a reviewer looks at (each proposed or changed unit beside its
source note, the review items by the fields they name, the diff, and the evaluation questions
whose fused rank the change would move, from a scratch evaluation that publishes nothing);
:mod:`.page` renders it, escaped, with Jinja2.
"""
