// Package statekey finds the state key, the one that seals the Secrets and tokens the state
// store keeps for offline reboots: a file of 32 raw bytes, or a file that holds the key sealed
// by the gateway's TPM 2.0.
//
// A raw key file protects a copy of the database alone: whoever holds the disk holds the key
// beside it. Sealed by the TPM, the file is of no use without the TPM chip that sealed it: the
// key is a sealed data object under the TPM's storage root key (the TCG's ECC P-256 SRK
// template, derived again at each start from the owner hierarchy's seed, so nothing is kept
// in the TPM's own memory), fixed to that TPM and parent. The key is unsealed through a
// session salted to the SRK with its response encrypted, so that it does not cross the bus in
// the clear. It is not bound to PCR values: a firmware update would then lock the gateway out
// of its own records.
package statekey

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
	"github.com/google/go-tpm/tpm2/transport/linuxtpm"
	"github.com/google/go-tpm/tpm2/transport/linuxudstpm"

	"github.com/holdfast-dev/holdfast/offline"
)

// sealedMagic opens a key file sealed by a TPM; what follows is the sealed object's public
// and private parts, each after its length (uvarint).
const sealedMagic = "holdfast state key sealed by TPM 2.0, v1\n"

// ErrWrongTPM is the error for a sealed key file the TPM cannot unseal: sealed by another TPM
// (the disk was moved, or copied), or altered.
var ErrWrongTPM = errors.New("the TPM cannot unseal the state key")

// Load returns the state key of path. With tpmPath "" the file holds the key's raw bytes
// (offline.LoadKey). Otherwise tpmPath names the TPM (the kernel's resource manager,
// /dev/tpmrm0, or a TPM simulator's unix socket) and the file holds the key sealed by it: a
// missing file gets a new key, sealed; a raw key file is sealed in its place, the same key,
// so that the records it sealed stay readable. made reports that a new key was made.
func Load(path, tpmPath string) (key *offline.Key, made bool, err error) {
	if tpmPath == "" {
		key, err = offline.LoadKey(path)
		return key, false, err
	}
	b, err := offline.ReadKeyFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		raw := make([]byte, offline.KeySize)
		if _, err := rand.Read(raw); err != nil {
			return nil, false, fmt.Errorf("make a state key: %w", err)
		}
		if err := sealTo(path, tpmPath, raw); err != nil {
			return nil, false, err
		}
		key, err = offline.NewKey(raw)
		return key, true, err
	case err != nil:
		return nil, false, err
	case len(b) == offline.KeySize:
		// A raw key from before the TPM was configured: the same key, sealed.
		if err := sealTo(path, tpmPath, b); err != nil {
			return nil, false, fmt.Errorf("seal the existing state key %s: %w", path, err)
		}
		key, err = offline.NewKey(b)
		return key, false, err
	}
	raw, err := unsealFrom(b, tpmPath)
	if err != nil {
		return nil, false, fmt.Errorf("state key %s: %w", path, err)
	}
	key, err = offline.NewKey(raw)
	if err != nil {
		return nil, false, fmt.Errorf("state key %s, unsealed: %w", path, err)
	}
	return key, false, nil
}

// sealTo seals raw with the TPM and writes it to path (0600, replacing what was there at
// once: a crash leaves the old file or the new one).
func sealTo(path, tpmPath string, raw []byte) error {
	tpm, err := openTPM(tpmPath)
	if err != nil {
		return err
	}
	defer tpm.Close()
	blob, err := seal(tpm, raw)
	if err != nil {
		return fmt.Errorf("seal the state key with the TPM at %s: %w", tpmPath, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("write the sealed state key: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write the sealed state key: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(blob); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write the sealed state key: %w", err)
	}
	return nil
}

func unsealFrom(b []byte, tpmPath string) ([]byte, error) {
	tpm, err := openTPM(tpmPath)
	if err != nil {
		return nil, err
	}
	defer tpm.Close()
	return unseal(tpm, b)
}

// openTPM opens the TPM at path: a unix socket is a simulator's (swtpm), anything else a
// character device.
func openTPM(path string) (transport.TPMCloser, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("open the TPM: %w", err)
	}
	var tpm transport.TPMCloser
	if fi.Mode()&fs.ModeSocket != 0 {
		tpm, err = linuxudstpm.Open(path)
	} else {
		tpm, err = linuxtpm.Open(path)
	}
	if err != nil {
		return nil, fmt.Errorf("open the TPM at %s: %w", path, err)
	}
	return tpm, nil
}

// srk makes the storage root key again (the same key every time from the owner hierarchy's
// seed) and returns it loaded; the caller flushes it.
func srk(tpm transport.TPM) (*tpm2.CreatePrimaryResponse, error) {
	rsp, err := tpm2.CreatePrimary{
		PrimaryHandle: tpm2.TPMRHOwner,
		InPublic:      tpm2.New2B(tpm2.ECCSRKTemplate),
	}.Execute(tpm)
	if err != nil {
		return nil, fmt.Errorf("create the storage root key: %w", err)
	}
	return rsp, nil
}

func flush(tpm transport.TPM, h tpm2.TPMHandle) {
	_, _ = tpm2.FlushContext{FlushHandle: h}.Execute(tpm)
}

// seal returns raw sealed by tpm, as the key file holds it.
func seal(tpm transport.TPM, raw []byte) ([]byte, error) {
	parent, err := srk(tpm)
	if err != nil {
		return nil, err
	}
	defer flush(tpm, parent.ObjectHandle)
	rsp, err := tpm2.Create{
		ParentHandle: tpm2.NamedHandle{Handle: parent.ObjectHandle, Name: parent.Name},
		InSensitive: tpm2.TPM2BSensitiveCreate{Sensitive: &tpm2.TPMSSensitiveCreate{
			Data: tpm2.NewTPMUSensitiveCreate(&tpm2.TPM2BSensitiveData{Buffer: raw}),
		}},
		InPublic: tpm2.New2B(tpm2.TPMTPublic{
			Type:    tpm2.TPMAlgKeyedHash,
			NameAlg: tpm2.TPMAlgSHA256,
			ObjectAttributes: tpm2.TPMAObject{
				FixedTPM:     true, // never leaves this TPM
				FixedParent:  true,
				UserWithAuth: true, // no policy: no PCRs to be locked out by
				NoDA:         true,
			},
		}),
	}.Execute(tpm)
	if err != nil {
		return nil, fmt.Errorf("create the sealed object: %w", err)
	}
	pub, priv := tpm2.Marshal(rsp.OutPublic), tpm2.Marshal(rsp.OutPrivate)
	b := append([]byte(sealedMagic), binary.AppendUvarint(nil, uint64(len(pub)))...)
	b = append(b, pub...)
	b = binary.AppendUvarint(b, uint64(len(priv)))
	return append(b, priv...), nil
}

// unseal returns the key a sealed key file holds.
func unseal(tpm transport.TPM, b []byte) ([]byte, error) {
	pub, priv, err := splitSealed(b)
	if err != nil {
		return nil, err
	}
	parent, err := srk(tpm)
	if err != nil {
		return nil, err
	}
	defer flush(tpm, parent.ObjectHandle)
	loaded, err := tpm2.Load{
		ParentHandle: tpm2.NamedHandle{Handle: parent.ObjectHandle, Name: parent.Name},
		InPrivate:    *priv,
		InPublic:     *pub,
	}.Execute(tpm)
	if err != nil {
		return nil, fmt.Errorf("%w (sealed by another TPM, or altered): load: %w", ErrWrongTPM, err)
	}
	defer flush(tpm, loaded.ObjectHandle)
	srkPub, err := parent.OutPublic.Contents()
	if err != nil {
		return nil, fmt.Errorf("storage root key: %w", err)
	}
	rsp, err := tpm2.Unseal{
		ItemHandle: tpm2.AuthHandle{
			Handle: loaded.ObjectHandle,
			Name:   loaded.Name,
			Auth: tpm2.HMAC(tpm2.TPMAlgSHA256, 16, tpm2.AESEncryption(128, tpm2.EncryptOut),
				tpm2.Salted(parent.ObjectHandle, *srkPub)),
		},
	}.Execute(tpm)
	if err != nil {
		return nil, fmt.Errorf("%w: unseal: %w", ErrWrongTPM, err)
	}
	return rsp.OutData.Buffer, nil
}

// splitSealed reads the parts of a sealed key file.
func splitSealed(b []byte) (*tpm2.TPM2BPublic, *tpm2.TPM2BPrivate, error) {
	rest, ok := bytes.CutPrefix(b, []byte(sealedMagic))
	if !ok {
		return nil, nil, fmt.Errorf("%w: neither %d raw bytes nor a key sealed by a TPM", offline.ErrInvalid, offline.KeySize)
	}
	part := func(what string) ([]byte, error) {
		n, size := binary.Uvarint(rest)
		if size <= 0 || n > uint64(len(rest)-size) {
			return nil, fmt.Errorf("%w: the sealed key's %s is cut", offline.ErrInvalid, what)
		}
		p := rest[size : size+int(n)]
		rest = rest[size+int(n):]
		return p, nil
	}
	pubBytes, err := part("public part")
	if err != nil {
		return nil, nil, err
	}
	privBytes, err := part("private part")
	if err != nil {
		return nil, nil, err
	}
	pub, err := tpm2.Unmarshal[tpm2.TPM2BPublic](pubBytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: the sealed key's public part: %w", offline.ErrInvalid, err)
	}
	priv, err := tpm2.Unmarshal[tpm2.TPM2BPrivate](privBytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: the sealed key's private part: %w", offline.ErrInvalid, err)
	}
	return pub, priv, nil
}
