package driver

import (
	"context"
	"strings"
	"testing"
)

// sharing is a driver whose one resource takes shares (protocol 1.3), and not admin access.
type sharing struct{ heard []DeviceShare }

func (d *sharing) Resources() []Resource {
	return []Resource{{Name: "example.com/gpu", Shares: true}}
}

func (d *sharing) ListDevices(context.Context, string) ([]Device, error) {
	return []Device{{ID: "gpu-0", Health: Healthy, AllowMultipleAllocations: true}}, nil
}

func (d *sharing) Shares(_ context.Context, _ string, shares []DeviceShare) (Grant, error) {
	d.heard = append(d.heard, shares...)
	return Grant{Envs: map[string]string{"SHARE": shares[0].ShareID}}, nil
}

func TestSharesReachTheSharerAndAdminAccessWithoutItsFlagIsNotImplemented(t *testing.T) {
	d := &sharing{}
	s := start(t, context.Background(), d)
	s.send(`{"jsonrpc":"2.0","id":1,"method":"allocate","params":{"resource":"example.com/gpu","containers":[` +
		`{"device_ids":["gpu-0"],"shares":[{"device_id":"gpu-0","share_id":"s-1","consumed_capacity":{"memory":"8Gi"}}]}]}}`)
	answer := s.next()
	grant := answer["result"].(map[string]any)["containers"].([]any)[0].(map[string]any)
	if grant["envs"].(map[string]any)["SHARE"] != "s-1" || len(d.heard) != 1 || d.heard[0].ConsumedCapacity["memory"] != "8Gi" {
		t.Fatalf("the share did not reach Shares: %v, heard %v", answer, d.heard)
	}
	s.send(`{"jsonrpc":"2.0","id":2,"method":"allocate","params":{"resource":"example.com/gpu","containers":[{"device_ids":["gpu-0"],"admin_access":true}]}}`)
	if code := s.next()["error"].(map[string]any)["code"]; code != float64(CodeMethodNotFound) {
		t.Fatalf("admin access without the flag: code %v, want %d", code, CodeMethodNotFound)
	}
	s.send(`{"jsonrpc":"2.0","id":3,"method":"allocate","params":{"resource":"example.com/gpu","containers":[` +
		`{"device_ids":["gpu-0"],"shares":[{"device_id":"gpu-0","share_id":"s-2"}]},{"device_ids":["gpu-0"]}]}}`)
	refused := s.next()["error"].(map[string]any)
	if refused["code"] != float64(CodeInvalidParams) || !strings.Contains(refused["message"].(string), "some containers but not all") {
		t.Fatalf("a mix of shared and plain containers: %v", refused)
	}
}
