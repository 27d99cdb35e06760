"""Google Cloud's APIs as the run's supervisor (supervisor.py) calls them from a TPU VM, with the VM's own
service account (`create` gives the VM the cloud-platform scope): an access token from the metadata
server, the TPU API's DELETE of a node (and of its queued resource), and Cloud Storage's upload of one
object (the run's record, bucket_writer.py). A target may name other endpoints (`api`, `endpoint`,
`metadata_url`): the tests' emulators on 127.0.0.1.

Python 3.8+ and the standard library only: shipped into the run folder beside supervisor.py.
"""

import json
import urllib.error
import urllib.parse
import urllib.request

METADATA_URL = "http://metadata.google.internal/computeMetadata/v1"
TPU_API = "https://tpu.googleapis.com"


def metadata_token(metadata_url=None):
    """An access token of the VM's service account, from the metadata server."""
    request = urllib.request.Request(
        (metadata_url or METADATA_URL).rstrip("/") + "/instance/service-accounts/default/token",
        headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read().decode())["access_token"]


def delete_tpu_node(target):
    """DELETE the node through the TPU API with the VM's own credentials; a node made from a queued
    resource is deleted with it (`force`: the request and its node), else the request would stay queued."""
    token = metadata_token(target.get("metadata_url"))
    api = (target.get("api") or TPU_API).rstrip("/")
    if target.get("queued_resource"):
        url = f"{api}/v2/{target['queued_resource']}?force=true"
    else:
        url = f"{api}/v2/{target['node']}"
    request = urllib.request.Request(url, method="DELETE", headers={"Authorization": f"Bearer {token}"})
    try:
        urllib.request.urlopen(request, timeout=30).close()
    except urllib.error.HTTPError as exc:
        if exc.code != 404:  # gone already is what we wanted
            raise


def upload_object(target, name, data):
    """Store `data` as object `name` of the target's bucket through Cloud Storage's JSON API, with the VM's
    credentials when the target's `auth` is `metadata` (none for an emulator); its gs:// address."""
    endpoint = target["endpoint"].rstrip("/")
    url = (f"{endpoint}/upload/storage/v1/b/{urllib.parse.quote(target['bucket'], safe='')}/o"
           f"?uploadType=media&name={urllib.parse.quote(name, safe='')}")
    # octet-stream: an emulator would parse a JSON body instead of storing it
    headers = {"Content-Type": "application/octet-stream"}
    if target.get("auth") == "metadata":
        headers["Authorization"] = "Bearer " + metadata_token(target.get("metadata_url"))
    request = urllib.request.Request(url, data=data, method="POST", headers=headers)
    urllib.request.urlopen(request, timeout=30).close()
    return f"gs://{target['bucket']}/{name}"
