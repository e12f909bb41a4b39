"""devfs: a devshim driver serving host device nodes (/dev/ttyUSB*, /dev/fuse, /dev/kvm) by glob."""
