module example.com/go-fpga

go 1.26.0

require devshim.local/driver v0.0.0

// The SDK from this checkout. A vendor copies sdk/go next to its driver (or
// vendors it) and points this line there.
replace devshim.local/driver => ../../sdk/go
