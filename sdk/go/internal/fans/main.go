// Command fans is docs/sdk.md's smallest driver, written with the Go SDK.
package main

import (
	"context"
	"fmt"
	"strings"

	"devshim.local/driver"
)

type fans struct{}

func (fans) Resources() []driver.Resource {
	return []driver.Resource{{Name: "example.com/fan"}}
}

func (fans) ListDevices(ctx context.Context, resource string) ([]driver.Device, error) {
	var devices []driver.Device
	for i := range 4 {
		devices = append(devices, driver.Device{ID: fmt.Sprintf("fan%d", i), Health: driver.Healthy})
	}
	return devices, nil
}

func (fans) Allocate(ctx context.Context, resource string, containers [][]string) ([]driver.Grant, error) {
	var grants []driver.Grant
	for _, ids := range containers {
		grants = append(grants, driver.Grant{Envs: map[string]string{"FANS": strings.Join(ids, ",")}})
	}
	return grants, nil
}

func main() {
	driver.Run(fans{}, driver.Options{Name: "fans"})
}
