// Package driver is devshim's Go SDK: it speaks the driver protocol
// (docs/driver-protocol.md, schema proto/driver/v1/driver.proto) on a driver's
// stdin and stdout, so a driver implements only what it knows about its devices.
//
// A driver implements [Driver] (its resources and their device lists) and, for
// each optional capability, the small interface that names it: [Allocator] for
// per-call grants, [PreferredAllocator], [PreStarter], [Deallocator],
// [PostStopper], [CDISpecShipper] for the CDI specs it ships, [Initializer] and
// [Shutdowner] for its lifecycle. [Run] serves it over the process's stdin and
// stdout; [Serve] over any reader and writer.
//
// The SDK owns stdout: [Run] points file descriptor 1 (and os.Stdout) at stderr
// before it serves, keeping the real stdout to itself, so a stray fmt.Println
// lands in devshim's log instead of breaking the protocol.
//
// Every request runs in a goroutine of its own (a slow PreferredAllocation never
// holds up an Allocate), at most [MaxInFlight] at once; a line longer than
// [MaxLineBytes] ends the connection, as it does in devshim.
//
// The message types (types_gen.go) are generated from the schema by
// scripts/generate_go_types.py; a field a later protocol minor adds appears in
// them as a new field, left out of the JSON while at its default.
package driver
