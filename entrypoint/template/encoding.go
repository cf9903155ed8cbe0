package template

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	yaml2 "go.yaml.in/yaml/v2"
	yaml3 "go.yaml.in/yaml/v3"
)

func base64Decode(s string) (string, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return "", fmt.Errorf("base64Decode: %w", err)
	}
	return string(b), nil
}

func base64URLDecode(s string) (string, error) {
	b, err := base64.URLEncoding.DecodeString(s)
	if err != nil {
		return "", fmt.Errorf("base64URLDecode: %w", err)
	}
	return string(b), nil
}

func hmacSHA256Hex(message, key string) string {
	h := hmac.New(sha256.New, []byte(key))
	h.Write([]byte(message))
	return hex.EncodeToString(h.Sum(nil))
}

// The parse* helpers read "" as the zero value, as consul-template does
// for a key that is not fetched yet.

func parseBool(s string) (bool, error) {
	if s == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, fmt.Errorf("parseBool: %w", err)
	}
	return b, nil
}

func parseFloat(s string) (float64, error) {
	if s == "" {
		return 0, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("parseFloat: %w", err)
	}
	return f, nil
}

func parseInt(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parseInt: %w", err)
	}
	return n, nil
}

func parseUint(s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parseUint: %w", err)
	}
	return n, nil
}

func parseJSON(s string) (any, error) {
	if s == "" {
		return map[string]any{}, nil
	}
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return nil, fmt.Errorf("parseJSON: %w", err)
	}
	return v, nil
}

// parseYAML decodes with string-keyed maps (consul-template's YAML library
// yields interface-keyed ones, which toJSON cannot encode).
func parseYAML(s string) (any, error) {
	if s == "" {
		return map[string]any{}, nil
	}
	var v any
	if err := yaml3.Unmarshal([]byte(s), &v); err != nil {
		return nil, fmt.Errorf("parseYAML: %w", err)
	}
	return v, nil
}

func toJSON(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("toJSON: %w", err)
	}
	return string(bytes.TrimSpace(b)), nil
}

func toJSONPretty(v any) (string, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return "", fmt.Errorf("toJSONPretty: %w", err)
	}
	return string(bytes.TrimSpace(b)), nil
}

func unescapedJSON(v any, indent string) (string, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", indent)
	if err := enc.Encode(v); err != nil {
		return "", fmt.Errorf("toUnescapedJSON: %w", err)
	}
	return strings.TrimRight(b.String(), "\r\n"), nil
}

// toYAML encodes as consul-template does (the yaml.v2 layout: two-space
// indentation, sequences not indented under their key).
func toYAML(v any) (string, error) {
	b, err := yaml2.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("toYAML: %w", err)
	}
	return string(bytes.TrimSpace(b)), nil
}
