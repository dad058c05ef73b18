"""One small adaptor per heavy SDK: imported on first use, with the error types wmctl tells
apart. Nothing else imports ``docker`` or ``kubernetes`` at module level, so ``wmctl --help``
and every dry run load neither."""
