package driver

// The proto3 JSON reader the generated UnmarshalJSON methods (types_gen.go) share: what
// devshim's Python SDK accepts through protobuf's own parser, so a driver in either language
// refuses the same params (tests/conformance holds the vectors both are run through).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

var null = []byte("null")

func isNull(raw []byte) bool { return bytes.Equal(bytes.TrimSpace(raw), null) }

// readObject calls field for each member of the JSON object data; field answers whether it
// knows the key. An unknown key is an error (as protobuf's parser has it), null is the default.
func readObject(data []byte, message string, field func(key string, raw []byte) (bool, error)) error {
	if isNull(data) {
		return nil
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(data, &members); err != nil {
		return fmt.Errorf("%s must be an object", message)
	}
	for key, raw := range members {
		known, err := field(key, raw)
		if err != nil {
			return fmt.Errorf("%s.%s: %w", message, key, err)
		}
		if !known {
			return fmt.Errorf("%s has no field %q", message, key)
		}
	}
	return nil
}

func readString(raw []byte, v *string) error {
	if isNull(raw) {
		*v = ""
		return nil
	}
	if len(raw) == 0 || raw[0] != '"' {
		return fmt.Errorf("expected a string, got %s", shown(raw))
	}
	return json.Unmarshal(raw, v)
}

func readBool(raw []byte, v *bool) error {
	switch string(raw) {
	case "null", "false":
		*v = false
	case "true":
		*v = true
	default:
		return fmt.Errorf("expected true or false, got %s", shown(raw))
	}
	return nil
}

// readInteger reads a number, or a string holding one (proto3 JSON's int64 form, which every
// integer field also accepts), integral and within [low, high].
func readInteger(raw []byte, low, high int64) (int64, error) {
	text := string(raw)
	if len(raw) > 0 && raw[0] == '"' {
		if err := json.Unmarshal(raw, &text); err != nil {
			return 0, err
		}
	} else if len(raw) == 0 || !(raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9') {
		return 0, fmt.Errorf("expected an integer, got %s", shown(raw))
	}
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		f, ferr := strconv.ParseFloat(text, 64)
		if ferr != nil || f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
			return 0, fmt.Errorf("expected an integer, got %s", shown(raw))
		}
		n = int64(f)
	}
	if n < low || n > high {
		return 0, fmt.Errorf("%d is out of range", n)
	}
	return n, nil
}

func readInt32(raw []byte, v *int32) error {
	if isNull(raw) {
		*v = 0
		return nil
	}
	n, err := readInteger(raw, math.MinInt32, math.MaxInt32)
	*v = int32(n)
	return err
}

func readInt64(raw []byte, v *int64) error {
	if isNull(raw) {
		*v = 0
		return nil
	}
	n, err := readInteger(raw, math.MinInt64, math.MaxInt64)
	*v = n
	return err
}

// readEnum reads a value's name, or its number (an open enum keeps numbers it does not name).
func readEnum(raw []byte, v *int32, enum string, byName func(string) (int32, bool)) error {
	if isNull(raw) {
		*v = 0
		return nil
	}
	if len(raw) > 0 && raw[0] == '"' {
		var name string
		if err := json.Unmarshal(raw, &name); err != nil {
			return err
		}
		n, ok := byName(name)
		if !ok {
			return fmt.Errorf("%q is not a value of %s", name, enum)
		}
		*v = n
		return nil
	}
	return readInt32(raw, v)
}

func enumName(number int32, name string) string {
	if name == "" {
		return strconv.Itoa(int(number))
	}
	return name
}

func writeEnum(number int32, name string) ([]byte, error) {
	if name == "" {
		return []byte(strconv.Itoa(int(number))), nil
	}
	return json.Marshal(name)
}

// readOptional reads a oneof member or a proto3 optional scalar: present (even at its default)
// exactly when set; null leaves it unset.
func readOptional[T any](raw []byte, v **T, one func([]byte, *T) error) error {
	if isNull(raw) {
		*v = nil
		return nil
	}
	var value T
	if err := one(raw, &value); err != nil {
		return err
	}
	*v = &value
	return nil
}

func readArray(raw []byte) ([]json.RawMessage, error) {
	if isNull(raw) {
		return nil, nil
	}
	if len(raw) == 0 || raw[0] != '[' {
		return nil, fmt.Errorf("expected a list, got %s", shown(raw))
	}
	var items []json.RawMessage
	return items, json.Unmarshal(raw, &items)
}

func readList[T any](raw []byte, v *[]T, one func([]byte, *T) error) error {
	items, err := readArray(raw)
	if err != nil {
		return err
	}
	out := make([]T, len(items))
	for i, item := range items {
		if isNull(item) { // protobuf's parser refuses null inside a list
			return fmt.Errorf("item %d is null", i)
		}
		if err := one(item, &out[i]); err != nil {
			return fmt.Errorf("item %d: %w", i, err)
		}
	}
	*v = out
	return nil
}

func readMessages[T any, P interface {
	*T
	json.Unmarshaler
}](raw []byte, v *[]T) error {
	return readList(raw, v, func(item []byte, m *T) error { return P(m).UnmarshalJSON(item) })
}

func readMessage[T any, P interface {
	*T
	json.Unmarshaler
}](raw []byte, v **T) error {
	if isNull(raw) {
		*v = nil
		return nil
	}
	m := new(T)
	if err := P(m).UnmarshalJSON(raw); err != nil {
		return err
	}
	*v = m
	return nil
}

func readMap[T any](raw []byte, v *map[string]T, one func([]byte, *T) error) error {
	if isNull(raw) {
		*v = nil
		return nil
	}
	if len(raw) == 0 || raw[0] != '{' {
		return fmt.Errorf("expected an object, got %s", shown(raw))
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(raw, &members); err != nil {
		return err
	}
	out := make(map[string]T, len(members))
	for key, item := range members {
		if isNull(item) {
			return fmt.Errorf("%q is null", key)
		}
		var value T
		if err := one(item, &value); err != nil {
			return fmt.Errorf("%q: %w", key, err)
		}
		out[key] = value
	}
	*v = out
	return nil
}

func readMessageMap[T any, P interface {
	*T
	json.Unmarshaler
}](raw []byte, v *map[string]T) error {
	return readMap(raw, v, func(item []byte, m *T) error { return P(m).UnmarshalJSON(item) })
}

// shown is raw JSON for an error message, cut short: params are not trusted to be small.
func shown(raw []byte) string {
	const most = 40
	if len(raw) > most {
		return string(raw[:most]) + "..."
	}
	return string(raw)
}
