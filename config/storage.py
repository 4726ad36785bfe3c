"""Static files storage: hashed names for ES module imports too."""

from whitenoise.storage import CompressedManifestStaticFilesStorage


class StaticFilesStorage(CompressedManifestStaticFilesStorage):
    """Compress and hash static files, rewriting `import ... from "./x.js"` to hashed names.

    The annotator page is plain ES modules; without the rewrite a hashed (cached for a year)
    module would import its siblings by their plain names, which change on every release.
    """

    support_js_module_import_aggregation = True
