package driver

import (
	"errors"
	"fmt"
)

// The JSON-RPC error codes of the driver protocol (docs/driver-protocol.md,
// "Errors"); devshim maps each to the gRPC status the kubelet sees.
const (
	CodeParseError      = -32700 // the line is not JSON
	CodeInvalidRequest  = -32600 // not a JSON-RPC 2.0 request
	CodeMethodNotFound  = -32601 // an optional capability is absent
	CodeInvalidParams   = -32602 // params the schema does not allow
	CodeInternalError   = -32603 // the driver failed
	CodeUnknownDevice   = -32001 // INVALID_ARGUMENT at the kubelet
	CodeDeviceUnhealthy = -32002 // INVALID_ARGUMENT at the kubelet
	CodeUnknownResource = -32003 // INVALID_ARGUMENT at the kubelet
	CodeUnavailable     = -32004 // busy, try again: UNAVAILABLE at the kubelet
)

// Error is a JSON-RPC error object: return one (or wrap one) from a method to
// answer the request with its code and message. Any other error is answered as
// CodeInternalError with the error's text.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// Error gives the message and the code.
func (e *Error) Error() string { return fmt.Sprintf("%s (JSON-RPC error %d)", e.Message, e.Code) }

// Errorf is an *Error with code and a formatted message.
func Errorf(code int, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// UnknownDevice answers a request naming a device the resource does not have.
func UnknownDevice(resource, deviceID string) *Error {
	return Errorf(CodeUnknownDevice, "%s: unknown device '%s'", resource, deviceID)
}

// DeviceUnhealthy answers a request for a device that cannot be used now.
func DeviceUnhealthy(resource, deviceID string) *Error {
	return Errorf(CodeDeviceUnhealthy, "%s: device '%s' is unhealthy", resource, deviceID)
}

// Unavailable answers "busy, try again": the kubelet sees UNAVAILABLE.
func Unavailable(message string) *Error { return &Error{Code: CodeUnavailable, Message: message} }

func unknownResource(resource string) *Error {
	return Errorf(CodeUnknownResource, "unknown resource '%s'", resource)
}

func notImplemented(resource, method string) *Error {
	return Errorf(CodeMethodNotFound, "%s does not implement %s", resource, method)
}

func invalidParams(method string, reason error) *Error {
	return Errorf(CodeInvalidParams, "invalid %s params: %v", method, reason)
}

// asError is err as the error object that answers it.
func asError(err error) *Error {
	var rpc *Error
	if errors.As(err, &rpc) {
		return rpc
	}
	return &Error{Code: CodeInternalError, Message: err.Error()}
}

// ErrClosed is what a notification returns once the connection to devshim has ended.
var ErrClosed = errors.New("driver: not connected to devshim")
