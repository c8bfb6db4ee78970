# Runs one SQL query with DuckDB against an S3 endpoint and prints its
# first row, tab-separated: what the lake example and the tests read the
# objects back with. DuckDB's own `INSTALL httpfs` downloads from the
# internet; the extension comes from the PyPI wheel duckdb-extension-httpfs.
#   python3 read.py HOST:PORT ACCESS_KEY SECRET_KEY SQL
import glob, os, sys
import duckdb, duckdb_extension_httpfs

endpoint, key, secret, sql = sys.argv[1:5]
ext = glob.glob(os.path.join(os.path.dirname(duckdb_extension_httpfs.__file__), "**", "httpfs.duckdb_extension"), recursive=True)[0]
db = duckdb.connect()
db.execute(f"INSTALL '{ext}'")
db.execute("LOAD httpfs")
for name, value in [("s3_endpoint", endpoint), ("s3_url_style", "path"), ("s3_use_ssl", "false"),
                    ("s3_access_key_id", key), ("s3_secret_access_key", secret), ("s3_region", "us-east-1")]:
    db.execute(f"SET {name} = '{value}'")
print("\t".join(str(v) for v in db.execute(sql).fetchone()))
