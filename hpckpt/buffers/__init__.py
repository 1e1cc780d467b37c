"""Moving array leaves between the application's buffers and host memory."""
