package offline

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// KeySize is the size of a state key file: 32 random bytes, written by the
// firmware at provisioning (e.g. head -c 32 /dev/urandom).
const KeySize = 32

// Key encrypts the records that must not be readable from a stolen disk:
// Secrets and service account tokens. It is derived from the state key file;
// the file's bytes are never stored.
type Key struct {
	id       string
	aead     cipher.AEAD
	nonceKey []byte
}

// NewKey derives a Key from the raw KeySize bytes of a key file.
func NewKey(raw []byte) (*Key, error) {
	if len(raw) != KeySize {
		return nil, fmt.Errorf("%w: a state key is %d bytes, got %d", ErrInvalid, KeySize, len(raw))
	}
	derive := func(info string) []byte {
		k, err := hkdf.Key(sha256.New, raw, nil, info, 32)
		if err != nil {
			panic(err) // only for lengths sha256 cannot give
		}
		return k
	}
	block, err := aes.NewCipher(derive("holdfast state encryption"))
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Key{
		id:       hex.EncodeToString(derive("holdfast state key id")[:8]),
		aead:     aead,
		nonceKey: derive("holdfast state nonce"),
	}, nil
}

// ErrKeyExposed is LoadKey's error for a key file that others than its owner
// may read or write, or that belongs to another user than root or the agent's:
// a key anyone on the gateway can read protects nothing, and one anyone can
// replace lets them choose it. As OpenSSH refuses such private keys, holdfast
// refuses it rather than use it quietly.
var ErrKeyExposed = errors.New("state key file is not private")

// LoadKey reads a state key file of KeySize raw bytes (ReadKeyFile). A
// missing file is an error wrapping fs.ErrNotExist: the agent then keeps
// Secrets and tokens on tmpfs only.
func LoadKey(path string) (*Key, error) {
	raw, err := ReadKeyFile(path)
	if err != nil {
		return nil, err
	}
	k, err := NewKey(raw)
	if err != nil {
		return nil, fmt.Errorf("state key %s: %w", path, err)
	}
	return k, nil
}

// maxKeyFile bounds what ReadKeyFile reads: a raw key, or one sealed by a TPM
// (a few hundred bytes).
const maxKeyFile = 64 << 10

// ReadKeyFile reads a file that holds the state key, raw or sealed. A file
// readable or writable by group or others, or owned by another user than root
// or the agent's, is refused (ErrKeyExposed). The checks are made on the
// opened file, so that the file checked is the file read.
func ReadKeyFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read state key: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read state key: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("state key %s: %w: not a regular file (%s)", path, ErrInvalid, fi.Mode().Type())
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("state key %s: %w: mode %04o lets group or others read or write it (chmod 600 it, and since others could read it, replace it: records sealed with it are then re-read from the apiserver)", path, ErrKeyExposed, perm)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("state key %s: %w: owned by uid %d, neither root nor the agent's uid %d", path, ErrKeyExposed, st.Uid, os.Geteuid())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, fmt.Errorf("read state key: %w", err)
	}
	if len(b) > maxKeyFile {
		return nil, fmt.Errorf("state key %s: %w: over %d bytes", path, ErrInvalid, maxKeyFile)
	}
	return b, nil
}

// ID names the key without revealing it: the first 8 bytes of a value
// derived from it, in hex. Each encrypted record carries the ID of the key
// that sealed it, so a changed key file is told apart from a damaged record.
func (k *Key) ID() string { return k.id }

// sealedValue is the JSON payload (inside the usual checksum frame) of an
// encrypted record.
type sealedValue struct {
	KeyID string `json:"keyID"`
	Nonce []byte `json:"nonce"`
	Data  []byte `json:"data"`
}

// seal encrypts v's JSON with AES-GCM, bound (as additional data) to the
// record's place, so a value copied to another key does not open. The nonce
// is an HMAC of place and plaintext under a key of its own: the same value
// seals to the same bytes, which lets an unchanged put write nothing, and
// different values never share a nonce.
func (k *Key) seal(place string, v any) ([]byte, error) {
	if k == nil {
		return nil, fmt.Errorf("%w: %s", ErrNoKey, place)
	}
	plain, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode %T: %w", v, err)
	}
	mac := hmac.New(sha256.New, k.nonceKey)
	mac.Write([]byte(place))
	mac.Write([]byte{0})
	mac.Write(plain)
	nonce := mac.Sum(nil)[:k.aead.NonceSize()]
	return encodeValue(sealedValue{KeyID: k.id, Nonce: nonce, Data: k.aead.Seal(nil, nonce, plain, []byte(place))})
}

// sealOrFrame seals v with k, or frames it in the clear when there is no key: for the
// records that may hold a secret but must be kept without a key too (a pod's spec, a
// ConfigMap), unlike Secrets and tokens, which are never kept in the clear.
func (k *Key) sealOrFrame(place string, v any) ([]byte, error) {
	if k == nil {
		return encodeValue(v)
	}
	return k.seal(place, v)
}

// openSealedOrPlain decodes into v what sealOrFrame wrote: a sealed value as open does
// (ErrKeyMismatch if another key or none sealed it), a value in the clear as it is if plainOK
// (written while no key was configured; Open seals such records once one is), else as an
// undecodable record.
func (k *Key) openSealedOrPlain(place string, raw []byte, v any, plainOK bool) error {
	sealed, err := isSealed(raw)
	if err != nil {
		return err
	}
	if sealed {
		return k.open(place, raw, v)
	}
	if !plainOK {
		return fmt.Errorf("%w: %s is in the clear in a database whose records of its kind are sealed: holdfast did not write it", errUndecodable, place)
	}
	return decodeValue(raw, v)
}

// isSealed tells a sealed value from one framed in the clear by the keyID field no stored
// object (a pod record, a ConfigMap) has at its top level. Only that field is decoded: a
// ConfigMap's "data" is no sealedValue.Data.
func isSealed(raw []byte) (bool, error) {
	var probe struct {
		KeyID string `json:"keyID"`
	}
	if err := decodeValue(raw, &probe); err != nil {
		return false, err
	}
	return probe.KeyID != "", nil
}

// open decrypts a value seal wrote into v. A value sealed with another key
// (or read without a key) is ErrKeyMismatch: it is left in place, since the
// right key may come back. A value that does not open with the right key, or
// whose frame is damaged, is undecodable and gets quarantined.
func (k *Key) open(place string, raw []byte, v any) error {
	var sv sealedValue
	if err := decodeValue(raw, &sv); err != nil {
		return err
	}
	switch {
	case sv.KeyID == "" || len(sv.Data) == 0:
		return fmt.Errorf("%w: not a sealed value", errUndecodable)
	case k == nil:
		return fmt.Errorf("%w: %s was encrypted with key %s and no state key is loaded", ErrKeyMismatch, place, sv.KeyID)
	case sv.KeyID != k.id:
		return fmt.Errorf("%w: %s was encrypted with key %s, the state key file holds key %s", ErrKeyMismatch, place, sv.KeyID, k.id)
	case len(sv.Nonce) != k.aead.NonceSize():
		return fmt.Errorf("%w: nonce of %d bytes", errUndecodable, len(sv.Nonce))
	}
	plain, err := k.aead.Open(nil, sv.Nonce, sv.Data, []byte(place))
	if err != nil {
		return fmt.Errorf("%w: decrypt with key %s: %v", errUndecodable, k.id, err)
	}
	if err := json.Unmarshal(plain, v); err != nil {
		return fmt.Errorf("%w: %v", errUndecodable, err)
	}
	return nil
}

// Errors of encrypted records; test with errors.Is.
var (
	// ErrNoKey: the store was opened without a state key, so it refuses to
	// keep Secrets and tokens (they would be readable on disk).
	ErrNoKey = errors.New("no state key: Secrets and tokens are not kept on disk")
	// ErrKeyMismatch: the record was encrypted with another state key than
	// the one loaded (the key file changed or is missing). The record is
	// treated as missing and left in place.
	ErrKeyMismatch = errors.New("encrypted with another state key")
)
