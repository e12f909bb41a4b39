package driver

import (
	"context"
	"testing"
)

// attaching is a driver whose one device needs an attach step before a pod binds (protocol 1.4).
type attaching struct{ claims, detached []string }

func (d *attaching) Resources() []Resource {
	return []Resource{{Name: "example.com/gpu", Attach: true}, {Name: "example.com/plain"}}
}

func (d *attaching) ListDevices(context.Context, string) ([]Device, error) {
	binding := &DeviceBinding{Conditions: []string{"example.com/attached"}, FailureConditions: []string{"example.com/failed"}}
	return []Device{{ID: "gpu-0", Health: Healthy, Binding: binding}}, nil
}

func (d *attaching) Attach(_ context.Context, _, deviceID, claim, claimUID string) ([]BindingCondition, error) {
	d.claims = append(d.claims, deviceID+" "+claim+" "+claimUID)
	return []BindingCondition{{Type: "example.com/attached", Status: true, Reason: "Attached"}}, nil
}

func (d *attaching) Detach(_ context.Context, _, deviceID, claim, _ string) error {
	d.detached = append(d.detached, deviceID+" "+claim)
	return nil
}

func TestAttachReachesTheAttacherAndAResourceWithoutTheFlagIsNotImplemented(t *testing.T) {
	d := &attaching{}
	s := start(t, context.Background(), d)
	s.send(`{"jsonrpc":"2.0","id":1,"method":"attach","params":{"resource":"example.com/gpu","device_id":"gpu-0","claim":"default/c","claim_uid":"u-1"}}`)
	answer := s.next()
	conditions := answer["result"].(map[string]any)["conditions"].([]any)
	first := conditions[0].(map[string]any)
	if first["type"] != "example.com/attached" || first["status"] != true || first["reason"] != "Attached" {
		t.Fatalf("the answer is not the Attacher's: %v", answer)
	}
	if len(d.claims) != 1 || d.claims[0] != "gpu-0 default/c u-1" {
		t.Fatalf("Attach heard %v", d.claims)
	}
	s.send(`{"jsonrpc":"2.0","id":3,"method":"detach","params":{"resource":"example.com/gpu","device_id":"gpu-0","claim":"default/c","claim_uid":"u-1"}}`)
	if _, failed := s.next()["error"]; failed || len(d.detached) != 1 || d.detached[0] != "gpu-0 default/c" {
		t.Fatalf("detach did not reach the Detacher: %v", d.detached)
	}
	s.send(`{"jsonrpc":"2.0","id":2,"method":"attach","params":{"resource":"example.com/plain","device_id":"p-0","claim":"default/c","claim_uid":"u-1"}}`)
	if code := s.next()["error"].(map[string]any)["code"]; code != float64(CodeMethodNotFound) {
		t.Fatalf("attach without the flag: code %v, want %d", code, CodeMethodNotFound)
	}
}
