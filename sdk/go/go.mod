module devshim.local/driver

go 1.26.0
