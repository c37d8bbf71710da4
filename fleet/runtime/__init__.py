"""One supervisor process: the owner loop, boot and teardown, deaths, the gates, the zygote and its workers."""
